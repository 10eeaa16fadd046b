"""Weight ops (conv, transposed conv, linear, Edge's ``addmm``/``mm``) as `weight_fusion` sees
them: where their output channels sit in their weight, and the constant-only nodes that scale
or shift those channels, in the program's own dialect (`NodeMaker`)."""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from .dialect import dialect_op
from .names import keep_name, unique_name
from .ops import arg_at, op_name

# Batch norms by op name: (index of weight, bias, mean, var, eps, training flag or None, tuple result).
# aten/src/ATen/native/native_functions.yaml; `_native_batch_norm_legit_no_training` is what
# run_decompositions and to_edge make of an eval-mode batch norm, `batch_norm` what torch.export's
# training IR (and QNN's export passes) keep.
BATCH_NORMS = {
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4, 6, None, True),
    "aten.batch_norm.default": (1, 2, 3, 4, 7, 5, False),
    "aten.native_batch_norm.default": (1, 2, 3, 4, 7, 5, True),
}
# Batch norms that always use (and update) batch statistics.
TRAINING_BATCH_NORMS = frozenset({"aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
                                  "aten._native_batch_norm_legit_functional.default"})
# Convolutions by op name: (index of weight, bias, groups; index of `transposed`, or whether it is).
CONVS = {
    "aten.convolution.default": (1, 2, 8, 6),
    **{f"aten.conv{d}d.{o}": (1, 2, 6, False) for d in (1, 2, 3) for o in ("default", "padding")},
    **{f"aten.conv_transpose{d}d.{o}": (1, 2, 6, True) for d in (1, 2, 3) for o in ("default", "input")},
}
# Linears by op name: (index of weight, bias or None). Edge decomposes `linear` into
# addmm(b, x, permute_copy(W)) or mm(x, permute_copy(W)): the matrix is (in, out).
LINEARS = {"aten.linear.default": (1, 2), "aten.addmm.default": (2, 0), "aten.mm.default": (1, None)}
BINARY = {"aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
          "aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub"}
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# The ops `NodeMaker` inserts: a policy that skips one of them gets no rewrite (the fold would
# keep the inserted nodes at runtime).
INSERTED = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar",
                      "aten.rsqrt.default", "aten.neg.default", "aten.full.default", "aten.view.default",
                      "aten.view_copy.default", "aten.expand.default", "aten.expand_copy.default",
                      "aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default", "aten.addmm.default"})


def val(node: Any):
    """The ``meta["val"]`` of a node (None for anything else)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 and bf16 values are computed in fp32 (as eager's batch norm kernels do)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(frozen=True)
class WeightOp:
    """A conv or linear whose output channels the rewrite scales.

    Attributes:
        node: the op; weight, bias: its argument nodes (bias None when it has none).
        bias_index: the bias's position.
        layout: ``"conv"`` (weight (out, in/G, *k)), ``"conv_t"`` (weight (in, out/G, *k)),
            ``"linear"`` (weight (out, in)) or ``"matrix"`` (addmm/mm: matrix (in, out)).
        groups: the conv's groups (1 for a linear); channels: output channels.
    """

    node: torch.fx.Node
    weight: torch.fx.Node
    bias: Optional[torch.fx.Node]
    bias_index: int
    layout: str
    groups: int
    channels: int

    @property
    def channel_axis(self) -> int:
        """The output's channel dim: the last for a linear; for a conv, 1 when batched (output
        rank = weight rank) and 0 when unbatched (a conv{1,2,3}d or conv_transpose of a
        (C_in, *spatial) input gives (C_out, *spatial), one rank below its weight)."""
        out = val(self.node).dim()
        if self.layout in ("conv", "conv_t"):
            return out - val(self.weight).dim() + 1
        return out - 1


def weight_op(node: Any) -> Optional[WeightOp]:
    """`node` as a `WeightOp`, or None when it is not a conv or linear with a static weight
    shape and a per-channel bias (or none)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    name = op_name(node.target)
    if name in CONVS:
        w_i, b_i, g_i, transposed = CONVS[name]
        if not isinstance(transposed, bool):
            transposed = bool(arg_at(node, transposed))
        layout, groups = ("conv_t" if transposed else "conv"), arg_at(node, g_i) or 1
    elif name in LINEARS:
        w_i, b_i = LINEARS[name]
        layout, groups = ("linear" if name == "aten.linear.default" else "matrix"), 1
        if name == "aten.addmm.default" and (arg_at(node, 3) not in (None, 1) or arg_at(node, 4) not in (None, 1)):
            return None
    else:
        return None
    weight, bias = arg_at(node, w_i), arg_at(node, b_i) if b_i is not None else None
    w_val = val(weight)
    if not isinstance(w_val, torch.Tensor) or not isinstance(groups, int) or w_val.dim() < 2:
        return None
    shape = list(w_val.shape)
    if not all(isinstance(d, int) for d in shape) or (bias is not None and not isinstance(bias, torch.fx.Node)):
        return None
    channels = {"conv": shape[0], "conv_t": shape[1] * groups, "linear": shape[0], "matrix": shape[-1]}[layout]
    if bias is not None and tuple(val(bias).shape) != (channels,):
        return None  # an addmm's broadcast bias: not a per-channel vector
    return WeightOp(node, weight, bias, b_i if b_i is not None else 0, layout, groups, channels)


def batch_norm_output(bn: torch.fx.Node, tuple_result: bool) -> Optional[torch.fx.Node]:
    """The node whose value is `bn`'s normalised tensor: `bn`, or its only reader
    ``getitem(bn, 0)``; None when its saved statistics are read too."""
    if not tuple_result:
        return bn
    users = list(bn.users)
    if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
        return None
    return users[0]


@dataclass(frozen=True)
class DialectOps:
    """The program dialect's ops for what `NodeMaker` inserts."""

    mul: Any
    div: Any
    add: Any
    sub: Any
    add_scalar: Any
    rsqrt: Any
    neg: Any
    full: Any
    view: Any
    expand: Any
    addmm: Any
    cast: Any  # called with dtype=

    @staticmethod
    def of(program: ExportedProgram) -> "DialectOps":
        """Each field's op (`_ATEN_OPS`, in field order) in `program`'s dialect (`dialect_op`)."""
        return DialectOps(*(dialect_op(program, name) for name in _ATEN_OPS))


# The ATen overloads of `DialectOps`' fields, in field order.
_ATEN_OPS = ("aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar",
             "aten.rsqrt.default", "aten.neg.default", "aten.full.default", "aten.view.default", "aten.expand.default",
             "aten.addmm.default", "aten._to_copy.default")


class NodeMaker:
    """Inserts nodes into one graph, each with its ``meta["val"]`` (computed on the fake values
    of its inputs); records the constant-only ones (`made`)."""

    def __init__(self, graph: torch.fx.Graph, ops: DialectOps) -> None:
        self.graph, self.ops = graph, ops
        self.taken = {n.name for n in graph.nodes}
        self.made: set[torch.fx.Node] = set()
        self.created: list[torch.fx.Node] = []  # every node inserted, made or not

    def make(self, target, args, base: str, **kwargs) -> torch.fx.Node:
        """A constant-only node."""
        node = self.node(target, args, kwargs, base, None)
        self.made.add(node)
        return node

    def node(self, target, args, kwargs, base: str, like: Optional[torch.fx.Node]) -> torch.fx.Node:
        """A node named `base` (or ``base_N``) with `like`'s metadata (stack trace, module)."""
        name = unique_name(base, self.taken)
        self.taken.add(name)
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        self.created.append(node)
        if like is not None:
            node.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta", "unbacked_bindings")}
        vals = [val(a) if isinstance(a, torch.fx.Node) else a for a in args]
        fake = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
        with fake or contextlib.nullcontext():
            node.meta["val"] = target(*vals, **kwargs)
        return node

    def inserted_names(self) -> frozenset:
        """Names of the inserted nodes still in the graph (one pass over its nodes)."""
        alive = set(self.graph.nodes)
        return frozenset(n.name for n in self.created if n in alive)

    def cast(self, v: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        if val(v).dtype == dtype:
            return v
        return self.make(self.ops.cast, (v,), f"{v.name}_{str(dtype).split('.')[-1]}", dtype=dtype)

    def named(self, node: torch.fx.Node, base: str) -> torch.fx.Node:
        """`node` (a made node) renamed `base`: the lifted constant it folds into is then
        ``c_folded_<base>``."""
        if node.name != base and node in self.made:
            name = unique_name(base, self.taken)
            self.taken.add(name)
            keep_name(node, name)
        return node

    def full(self, channels: int, value: float, dtype: torch.dtype, base: str) -> torch.fx.Node:
        return self.make(self.ops.full, ([channels], value), base, dtype=dtype, device=torch.device("cpu"))

    def inverse_std(self, var: torch.fx.Node, eps: float, dtype: torch.dtype, base: str) -> torch.fx.Node:
        """``rsqrt(var + eps)`` in `dtype`."""
        plus = self.make(self.ops.add_scalar, (self.cast(var, dtype), eps), f"{base}_var_eps")
        return self.make(self.ops.rsqrt, (plus,), f"{base}_rsqrt")

    def scaled_weight(self, w_op: WeightOp, target, s: torch.fx.Node, name: str) -> torch.fx.Node:
        """``target(W, s)`` (``mul`` or ``div``) of `w_op`'s weight and the per-channel vector
        `s` (shape [channels]) along the weight's output-channel axis, in the weight's dtype.
        A grouped transposed conv's weight (in, out/G, *k) is viewed (G, in/G, out/G, *k), so
        that channel ``g * out/G + j`` scales ``W[g * in/G + i, j]``."""
        w_val = val(w_op.weight)
        shape, ones = list(w_val.shape), [1] * (w_val.dim() - 2)
        w, grouped = w_op.weight, w_op.layout == "conv_t" and w_op.groups > 1
        if grouped:
            g = w_op.groups
            w = self.make(self.ops.view, (w, [g, shape[0] // g] + shape[1:]), f"{name}_grouped")
            s = self.make(self.ops.view, (s, [g, 1, shape[1]] + ones), f"{name}_scale")
        else:
            view = {"conv": [-1, 1] + ones, "conv_t": [1, -1] + ones, "linear": [-1, 1], "matrix": [1, -1]}
            s = self.make(self.ops.view, (s, view[w_op.layout]), f"{name}_scale")
        w = self.make(target, (w, s), f"{name}_value")
        if grouped:
            w = self.make(self.ops.view, (w, shape), f"{name}_ungrouped")
        return self.named(self.cast(w, w_val.dtype), name)

    def with_operands(self, w_op: WeightOp, weight: torch.fx.Node, bias: Optional[torch.fx.Node]) -> torch.fx.Node:
        """`w_op` reading `weight` and `bias`: the node itself, or, for an ``mm`` given a
        bias, the ``addmm`` that replaces it under its name."""
        node = w_op.node
        name = op_name(node.target)
        if name == "aten.mm.default" and bias is not None:
            with self.graph.inserting_before(node):
                addmm = self.node(self.ops.addmm, (bias, node.args[0], weight), {}, f"{node.name}_addmm", node)
            self.created.remove(addmm)  # it is the mm, under the mm's name
            node.replace_all_uses_with(addmm)
            old = node.name
            self.graph.erase_node(node)
            return keep_name(addmm, old)
        args = list(node.args)
        args[CONVS[name][0] if name in CONVS else LINEARS[name][0]] = weight
        if bias is not None:
            args += [None] * (w_op.bias_index + 1 - len(args))
            args[w_op.bias_index] = bias
        node.args = tuple(args)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k not in ("weight", "bias")}
        return node


def batch_norm_operands(make: NodeMaker, w_op: WeightOp, stats: tuple, base: str) -> tuple:
    """The weight and bias of `w_op` with the batch norm of `stats` (gamma, beta, mean, var,
    eps; gamma and beta may be None) folded in: ``W * s`` and ``(b - mean) * rsqrt(var + eps)
    * gamma + beta``, in the order of torch.nn.utils.fusion.fuse_conv_bn_weights."""
    gamma, beta, mean, var, eps = stats
    ops, compute = make.ops, compute_dtype(val(w_op.weight).dtype)
    r = make.inverse_std(var, eps, compute, base)
    s = make.make(ops.mul, (make.cast(gamma, compute), r), f"{base}_scale") if gamma is not None else r
    weight = make.scaled_weight(w_op, ops.mul, s, f"{w_op.node.name}_fused_weight")
    mean = make.cast(mean, compute)
    b = make.make(ops.neg, (mean,), f"{base}_centred") if w_op.bias is None \
        else make.make(ops.sub, (make.cast(w_op.bias, compute), mean), f"{base}_centred")
    b = make.make(ops.mul, (b, r), f"{base}_normalised")
    if gamma is not None:
        b = make.make(ops.mul, (b, make.cast(gamma, compute)), f"{base}_scaled")
    if beta is not None:
        b = make.make(ops.add, (b, make.cast(beta, compute)), f"{base}_shifted")
    dtype = val(w_op.bias if w_op.bias is not None else w_op.weight).dtype
    return weight, make.named(make.cast(b, dtype), f"{w_op.node.name}_fused_bias")


def binary_operands(make: NodeMaker, w_op: WeightOp, kind: str, c: torch.fx.Node) -> tuple:
    """The weight and bias of `w_op` with ``* c``, ``/ c``, ``+ c`` or ``- c`` (`kind`) folded in;
    `c` a per-channel vector (shape [channels], compute dtype). A bias-less op gets a bias
    for ``+`` and ``-``."""
    base, compute = w_op.node.name, compute_dtype(val(w_op.weight).dtype)
    weight, bias = w_op.weight, w_op.bias
    if kind in ("mul", "div"):
        target = make.ops.mul if kind == "mul" else make.ops.div
        weight = make.scaled_weight(w_op, target, c, f"{base}_{kind}_weight")
        if bias is None:
            return weight, None
        b = make.make(target, (make.cast(bias, compute), c), f"{base}_{kind}_bias_value")
    else:
        start = make.cast(bias, compute) if bias is not None else make.full(w_op.channels, 0.0, compute,
                                                                              f"{base}_zero_bias")
        b = make.make(make.ops.add if kind == "add" else make.ops.sub, (start, c), f"{base}_{kind}_bias_value")
    return weight, make.named(make.cast(b, val(bias if bias is not None else w_op.weight).dtype), f"{base}_{kind}_bias")


def scale_and_shift(make: NodeMaker, x: torch.fx.Node, stats: tuple, bn: torch.fx.Node) -> torch.fx.Node:
    """The batch norm `bn` of `x` with `stats` (gamma, beta, mean, var, eps) as runtime ops
    ``(x - centre) * s + t`` by constants viewed [C, 1, ...] to broadcast over dim 1, in `x`'s
    dtype: the last node inserted (named ``<bn>_shifted``, or ``<bn>_scaled`` without a shift).

    In fp32 and fp64 there is no ``centre``, ``s = gamma * rsqrt(var + eps)`` and ``t = beta -
    mean * s``: what eager's CPU kernel computes (aten/src/ATen/native/cpu/batch_norm_kernel.cpp).
    In fp16 and bf16, where that kernel computes ``x * s + t`` in fp32 and rounds once, the two
    runtime ops would each round in the low precision and ``x * s`` and ``t`` cancel in a quiet
    channel (``|mean| >> sqrt(var + eps)``, measured: 4.0 off at an output scale of 8.9 where
    eager is 0.0018 off): there ``centre = mean`` and ``t = beta`` (none when absent), and ``x
    - mean`` is exact where ``x`` is near ``mean`` (Sterbenz), so each op rounds a value of the
    output's size."""
    gamma, beta, mean, var, eps = stats
    ops, x_val, base = make.ops, val(x), bn.name
    compute = compute_dtype(x_val.dtype)
    shape = [x_val.shape[1]] + [1] * (x_val.dim() - 2)
    view = lambda v, name: make.make(ops.view, (make.cast(v, x_val.dtype), shape), f"{base}_{name}")  # noqa: E731
    s = make.inverse_std(var, eps, compute, base)
    if gamma is not None:
        s = make.make(ops.mul, (make.cast(gamma, compute), s), f"{base}_gamma_rsqrt")
    if compute != x_val.dtype:
        x = make.node(ops.sub, (x, view(mean, "centre")), {}, f"{base}_centred", bn)
        t = view(beta, "shift") if beta is not None else None
    else:
        t = make.make(ops.mul, (make.cast(mean, compute), s), f"{base}_mean_scaled")
        t = make.make(ops.sub, (make.cast(beta, compute), t), f"{base}_beta_shift") if beta is not None \
            else make.make(ops.neg, (t,), f"{base}_beta_shift")
        t = view(t, "shift")
    out = make.node(ops.mul, (x, view(s, "scale")), {}, f"{base}_scaled", bn)
    return make.node(ops.add, (out, t), {}, f"{base}_shifted", bn) if t is not None else out


def channel_magnitudes(w_op: WeightOp, weight: torch.Tensor) -> torch.Tensor:
    """The largest ``|W|`` of each output channel of `w_op` (shape [channels], float64), from
    the value `weight` of its weight (layouts as in `WeightOp`)."""
    w = weight.detach().double().abs()
    if w_op.layout == "matrix":
        return w.amax(0)
    if w_op.layout == "conv_t":
        g = w_op.groups
        return w.reshape(g, w.shape[0] // g, w.shape[1], -1).amax(dim=(1, 3)).reshape(-1)
    return w.reshape(w.shape[0], -1).amax(1)
