"""Weight ops (conv, transposed conv, linear, Edge's ``addmm``/``mm``) as `weight_fusion` sees
them, and its formulas, each written once over ``o``: `Eager` computes it on tensors (the
checks read those values), `NodeMaker` inserts the same ops as constant-only nodes in the
program's own dialect (the fold evaluates them)."""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx

from ..core.names import keep_name, unique_name
from ..core.ops import arg_at, op_name
from ..core.torch_internals import detect_fake_mode, empty_fake

# aten/src/ATen/native/native_functions.yaml. Batch norms: (index of weight, bias, mean, var, eps,
# training flag or None, tuple result); `_native_batch_norm_legit_no_training` is what
# run_decompositions and to_edge make of an eval-mode batch norm, `batch_norm` training IR's.
BATCH_NORMS = {"aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4, 6, None, True),
               "aten.batch_norm.default": (1, 2, 3, 4, 7, 5, False),
               "aten.native_batch_norm.default": (1, 2, 3, 4, 7, 5, True)}
TRAINING_BATCH_NORMS = frozenset({"aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
                                  "aten._native_batch_norm_legit_functional.default"})  # batch statistics only
# Convolutions: (index of weight, bias, groups; index of `transposed`, or whether it is).
CONVS = {"aten.convolution.default": (1, 2, 8, 6),
         **{f"aten.conv{d}d.{o}": (1, 2, 6, False) for d in (1, 2, 3) for o in ("default", "padding")},
         **{f"aten.conv_transpose{d}d.{o}": (1, 2, 6, True) for d in (1, 2, 3) for o in ("default", "input")}}
# Linears: (index of weight, bias or None). Edge's `linear` is addmm(b, x, permute_copy(W)) or
# mm(x, permute_copy(W)): a matrix (in, out).
LINEARS = {"aten.linear.default": (1, 2), "aten.addmm.default": (2, 0), "aten.mm.default": (1, None)}
BINARY = {f"aten.{k}.{o}": k for k in ("mul", "div", "add", "sub") for o in ("Tensor", "Scalar")}
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# What `NodeMaker` inserts, by the formulas' names (a policy skipping one turns the rewrite off).
OPS = {"mul": "aten.mul.Tensor", "div": "aten.div.Tensor", "add": "aten.add.Tensor", "sub": "aten.sub.Tensor",
       "add_scalar": "aten.add.Scalar", "rsqrt": "aten.rsqrt.default", "neg": "aten.neg.default",
       "full": "aten.full.default", "view": "aten.view.default", "expand": "aten.expand.default",
       "cast": "aten._to_copy.default", "addmm": "aten.addmm.default"}


def val(node: Any):
    """The ``meta["val"]`` of a node (None for anything else)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The widest of `dtypes`, at least fp32: eager's batch norm computes fp16/bf16 activations
    in fp32 whatever its statistics' dtype and rounds once (aten/src/ATen/native/cpu/
    batch_norm_kernel.cpp); torch.nn.utils.fusion.fuse_conv_bn_weights computes in the promoted
    dtype and casts once at the end."""
    return functools.reduce(torch.promote_types, dtypes, torch.float32)


def aten_op(name: str):
    """The ATen overload `name` (``aten.mul.Tensor``)."""
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


@dataclass(frozen=True)
class WeightOp:
    """A conv or linear: `node`, its `weight` and `bias` nodes (bias None when absent) and
    `bias_index`; `layout` ``"conv"`` (weight (out, in/G, *k)), ``"conv_t"`` ((in, out/G, *k)),
    ``"linear"`` ((out, in)) or ``"matrix"`` (addmm/mm: (in, out)); `groups`; output `channels`."""

    node: torch.fx.Node
    weight: torch.fx.Node
    bias: Optional[torch.fx.Node]
    bias_index: int
    layout: str
    groups: int
    channels: int

    @property
    def channel_axis(self) -> int:
        """The output's channel dim: a linear's last; a conv's 1 when batched, 0 when not."""
        out = val(self.node).dim()
        return out - val(self.weight).dim() + 1 if self.layout in ("conv", "conv_t") else out - 1

    def per_channel(self, w: torch.Tensor, reduce) -> torch.Tensor:
        """``reduce(t, dims)`` of `w` (the weight's value) over all but the output channel:
        shape [channels]. Grouped transposed: channel ``g * out/G + j`` reads ``W[g * in/G + i, j]``."""
        if self.layout == "matrix":
            return reduce(w, (0,))
        if self.layout == "conv_t":
            return reduce(w.reshape(self.groups, w.shape[0] // self.groups, w.shape[1], -1), (1, 3)).reshape(-1)
        return reduce(w.reshape(w.shape[0], -1), (1,))


def weight_op(node: Any) -> Optional[WeightOp]:
    """`node` as a `WeightOp`, or None: not a conv or linear with a static weight shape and a
    per-channel bias (or none)."""
    name = op_name(node.target) if isinstance(node, torch.fx.Node) and node.op == "call_function" else ""
    if name in CONVS:
        w_i, b_i, g_i, transposed = CONVS[name]
        transposed = transposed if isinstance(transposed, bool) else bool(arg_at(node, transposed))
        layout, groups = ("conv_t" if transposed else "conv"), arg_at(node, g_i) or 1
    elif name in LINEARS:
        (w_i, b_i), layout, groups = LINEARS[name], "linear" if name == "aten.linear.default" else "matrix", 1
        if name == "aten.addmm.default" and (arg_at(node, 3) not in (None, 1) or arg_at(node, 4) not in (None, 1)):
            return None
    else:
        return None
    weight, bias = arg_at(node, w_i), arg_at(node, b_i) if b_i is not None else None
    shape = list(getattr(val(weight), "shape", ()))
    if len(shape) < 2 or not isinstance(groups, int) or not all(isinstance(d, int) for d in shape) \
            or (bias is not None and not isinstance(bias, torch.fx.Node)):
        return None
    channels = {"conv": shape[0], "conv_t": shape[1] * groups, "linear": shape[0], "matrix": shape[-1]}[layout]
    if bias is not None and tuple(val(bias).shape) != (channels,):
        return None  # an addmm's broadcast bias: not a per-channel vector
    return WeightOp(node, weight, bias, b_i if b_i is not None else 0, layout, groups, channels)


def batch_norm_output(bn: torch.fx.Node, tuple_result: bool) -> Optional[torch.fx.Node]:
    """`bn`'s normalised tensor: `bn`, or its only reader ``getitem(bn, 0)``; None when its saved
    statistics are read too."""
    users = list(bn.users)
    ok = len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0
    return bn if not tuple_result else users[0] if ok else None


class Eager:
    """The formulas' ops on tensors: the ATen ops `NodeMaker` inserts, called."""

    def op(self, name: str, *args, **kwargs):
        return aten_op(OPS[name])(*args, **kwargs)

    def cast(self, v, dtype: torch.dtype):
        return v if v is None or v.dtype == dtype else v.to(dtype)


class NodeMaker:
    """The formulas' ops as nodes of one graph, in its dialect (`ops`: `OPS`' names to its ops)."""

    def __init__(self, graph: torch.fx.Graph, ops: dict) -> None:
        self.graph, self.ops, self.prefix = graph, ops, ""
        self.taken = {n.name for n in graph.nodes}
        self.created: list[torch.fx.Node] = []  # every node inserted
        self.fakes: dict[tuple, torch.Tensor] = {}
        self.mode = detect_fake_mode([val(n) for n in graph.find_nodes(op="placeholder")])

    def op(self, name: str, *args, **kwargs) -> torch.fx.Node:
        """A constant-only node whose ``val`` is inferred, not dispatched (the formulas cast every
        operand to one dtype and shapes are static; fake dispatch costs more than the op)."""
        node = self.node(self.ops[name], args, kwargs, f"{self.prefix}{name}", None, infer=False)
        vals = [val(a) if isinstance(a, torch.fx.Node) else a for a in args]
        shape = list(args[0] if name == "full" else args[1]) if name in ("full", "view", "expand") else \
            list(max((v.shape for v in vals if isinstance(v, torch.Tensor)), key=math.prod))  # the other broadcasts
        if -1 in shape:
            shape[shape.index(-1)] = vals[0].numel() // -math.prod(shape)
        key = (tuple(shape), kwargs.get("dtype") or vals[0].dtype)
        if key not in self.fakes:  # shared by the nodes of one shape and dtype: nothing writes a "val"
            self.fakes[key] = empty_fake(self.mode, *key)
        node.meta["val"] = self.fakes[key]
        return node

    def node(self, target, args, kwargs, base: str, like: Optional[torch.fx.Node], infer: bool = True) -> torch.fx.Node:
        """A node named `base` (or ``base_N``) with `like`'s metadata (stack trace, module)."""
        name = unique_name(base, self.taken)
        self.taken.add(name)
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        self.created.append(node)
        if like is not None:
            node.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta", "unbacked_bindings")}
        if infer:
            with self.mode:
                node.meta["val"] = target(*[val(a) if isinstance(a, torch.fx.Node) else a for a in args], **kwargs)
        return node

    def cast(self, v, dtype: torch.dtype):
        return v if v is None or val(v).dtype == dtype else self.op("cast", v, dtype=dtype)

    def named(self, node: torch.fx.Node, base: str) -> torch.fx.Node:
        """`node` renamed `base`: the lifted constant it folds into is ``c_folded_<base>``."""
        if node.name != base and node in self.created:
            self.taken.add(keep_name(node, unique_name(base, self.taken)).name)
        return node

    def inserted_names(self) -> frozenset:
        """Names of the inserted nodes still in the graph."""
        alive = set(self.graph.nodes)
        return frozenset(n.name for n in self.created if n in alive)

    def with_operands(self, w_op: WeightOp, weight: torch.fx.Node, bias: Optional[torch.fx.Node]) -> torch.fx.Node:
        """`w_op` reading `weight` and `bias`: the node itself, or, for an ``mm`` given a bias,
        the ``addmm`` that replaces it under its name."""
        node, name = w_op.node, op_name(w_op.node.target)
        if name == "aten.mm.default" and bias is not None:
            with self.graph.inserting_before(node):
                addmm = self.node(self.ops["addmm"], (bias, node.args[0], weight), {}, f"{node.name}_addmm", node)
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


def bn_scale(o, gamma, var, eps: float, dtype: torch.dtype) -> tuple:
    """``(r, s)``: ``r = rsqrt(var + eps)`` and ``s = gamma * r`` (``r`` without gamma), in `dtype`."""
    r = o.op("rsqrt", o.op("add_scalar", o.cast(var, dtype), eps))
    return r, (o.op("mul", o.cast(gamma, dtype), r) if gamma is not None else r)


def bn_bias(o, b, stats: tuple, r, dtype: torch.dtype):
    """``(b - mean) * r * gamma + beta`` in `dtype` (``-mean`` without `b`): the order of
    torch.nn.utils.fusion.fuse_conv_bn_weights."""
    gamma, beta, mean = stats[0], stats[1], o.cast(stats[2], dtype)
    t = o.op("mul", o.op("sub", o.cast(b, dtype), mean) if b is not None else o.op("neg", mean), r)
    t = o.op("mul", t, o.cast(gamma, dtype)) if gamma is not None else t
    return o.op("add", t, o.cast(beta, dtype)) if beta is not None else t


def binary_bias(o, b, kind: str, c, dtype: torch.dtype):
    """``b <kind> c`` in `dtype` (`c` per channel); without `b`: none for ``*`` and ``/``, ``c``
    or ``-c`` for ``+`` and ``-`` (the signed zeros eager's ``y + c``, ``y - c`` keep)."""
    if b is None:
        return None if kind in ("mul", "div") else c if kind == "add" else o.op("neg", c)
    return o.op(kind, o.cast(b, dtype), c)


def scale_and_shift(o, x_dtype: torch.dtype, stats: tuple, dtype: torch.dtype) -> tuple:
    """``(centre, s, t)`` in `x_dtype` of a batch norm of `stats` (gamma, beta, mean, var, eps)
    computed as ``(x - centre) * s + t`` (no centre, no t when None). When `x_dtype` is `dtype`:
    no centre, ``s = gamma * rsqrt(var + eps)`` and ``t = beta - mean * s``, eager's own terms
    (batch_norm_kernel.cpp, ``batch_norm_cpu_collect_linear_and_constant_terms``). fp16 and
    bf16: ``x * s + t`` as two low-precision ops cancels in a quiet channel (``|mean| >>
    sqrt(var + eps)``), so ``centre = mean`` and ``t = beta`` (``x - mean`` is exact near the
    mean, Sterbenz), which the caller checks are exact in `x_dtype`."""
    gamma, beta, mean, var, eps = stats
    s = bn_scale(o, gamma, var, eps, dtype)[1]
    if x_dtype != dtype:
        return o.cast(mean, x_dtype), o.cast(s, x_dtype), o.cast(beta, x_dtype)
    t = o.op("mul", o.cast(mean, dtype), s)
    t = o.op("sub", o.cast(beta, dtype), t) if beta is not None else o.op("neg", t)
    return None, o.cast(s, x_dtype), o.cast(t, x_dtype)


def scaled_weight(m: NodeMaker, w_op: WeightOp, kind: str, s, dtype: torch.dtype, base: str):
    """``W * s`` or ``W / s`` (`kind`) of `w_op`'s weight and the per-channel node `s` (shape
    [channels], `dtype`) along its output channels, in `dtype`, cast once to the weight's."""
    shape, w_dtype, g = list(val(w_op.weight).shape), val(w_op.weight).dtype, w_op.groups
    ones, w = [1] * (len(shape) - 2), m.cast(w_op.weight, dtype)
    if w_op.layout == "conv_t" and g > 1:
        w = m.op("view", w, [g, shape[0] // g] + shape[1:])
        w = m.op("view", m.op(kind, w, m.op("view", s, [g, 1, shape[1]] + ones)), shape)
    else:
        view = {"conv": [-1, 1] + ones, "conv_t": [1, -1] + ones, "linear": [-1, 1], "matrix": [1, -1]}[w_op.layout]
        w = m.op(kind, w, m.op("view", s, view))
    return m.named(m.cast(w, w_dtype), base)
