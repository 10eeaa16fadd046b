"""Batch norms and constant scales and shifts folded into the weight and bias of the conv or
linear before them (issue 54).

An eval-mode batch norm is ``y * s + t`` per channel (dim 1) with ``s = gamma * rsqrt(var + eps)``
and ``t = beta - mean * s``, all constant. This rewrite of the working program (a preparation
step, like `transposed_gathers`) replaces, in the program's own dialect (ATen or Edge):

1. ``bn(op(x, W, b))`` -> ``op(x, W', b')`` with ``W' = W * s`` along the op's output-channel
   axis and ``b' = (b - mean) * rsqrt(var + eps) * gamma + beta`` (the node's own ``eps``; the
   order of torch.nn.utils.fusion.fuse_conv_bn_weights, so the values are the same bits), where
   ``op`` is a conv (1d/2d/3d, grouped, depthwise, with or without bias), a transposed conv
   (output channels on dim 1 of its weight, per group), a ``linear``, or Edge's ``addmm``/``mm``
   of a decomposed ``linear`` (output channels on dim 1 of the matrix it reads);
2. a batch norm with nothing to fuse into -> ``y * s_view + t_view`` (``aten.mul`` and
   ``aten.add`` by constants shaped ``[C, 1, ...]``): what every backend computes right, where
   QNN's BatchNorm builder ignores ``eps`` (executorch 1.5.1 backends/qualcomm/builders/
   op_batch_norm.py);
3. ``op(x) * c``, ``/ c``, ``+ c``, ``- c`` with ``c`` a constant scalar or a tensor that
   broadcasts along the output-channel axis only -> the op with ``W * c`` / ``W / c`` and
   ``b * c``, ``b / c``, ``b + c``, ``b - c`` (a bias is added where there was none), as
   Inductor's torch/_inductor/fx_passes/binary_folding.py does.

``W'`` and ``b'`` are constant-only nodes the fold then evaluates and stores as lifted constants
with its own machinery (names, dedup, size limits, growth budget, report); the old weight and
the batch norm's vectors lose their readers and leave the program. Values in fp16/bf16 are
computed in fp32 and cast back.

Constant here means: a parameter, buffer or lifted constant the program never writes
(`signature.unchanging_stored_specs`), a Python number, or a pure op of constants (Edge's
``permute_copy`` of a ``linear`` weight, a cast of a lifted scalar); never through a
dequantize. Not rewritten, each with a `Reason.NOT_FUSED` row saying why: training-mode batch
norm; runtime weights, statistics or scales; quantized operands (a dequantize read as weight,
statistic, scale or input, or a batch norm whose output is quantized: the rewrite would need an
encoding the quantizer never chose); a symbolic channel count; a ``c`` that does not broadcast
per output channel; a weight op whose output other ops read too (then 2. for a batch norm); a
copy of a weight another op also reads beyond the growth budget, or a weight above
``max_tensor_bytes`` (then 2.); ops the policy skips. ``FoldPolicy(fuse_into_weights=False)``
turns the rewrite off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputKind

from .hops import copy_uncompiled
from .names import keep_name, reserve_node_names, unique_name
from .ops import OpKind, op_facts, op_name
from .policy import FoldPolicy
from .quant import is_dequantize, is_quantize
from .reasons import Reason
from .report import Decision
from .signature import unchanging_stored_specs
from .sizes import nbytes, stored_tensor
from .torch_internals import program_with

# Batch norms by op name: (index of weight, bias, mean, var, eps, training flag or None, tuple result).
# aten/src/ATen/native/native_functions.yaml; `_native_batch_norm_legit_no_training` is what
# run_decompositions and to_edge make of an eval-mode batch norm, `batch_norm` what torch.export's
# training IR (and QNN's export passes) keep.
_BATCH_NORMS = {
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4, 6, None, True),
    "aten.batch_norm.default": (1, 2, 3, 4, 7, 5, False),
    "aten.native_batch_norm.default": (1, 2, 3, 4, 7, 5, True),
}
# Batch norms that always use (and update) batch statistics.
_TRAINING_BATCH_NORMS = {"aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
                         "aten._native_batch_norm_legit_functional.default"}
# Weight ops by op name: (index of weight, bias, groups; index of `transposed` or a constant).
_CONVS = {
    "aten.convolution.default": (1, 2, 8, 6),
    **{f"aten.conv{d}d.{o}": (1, 2, 6, False) for d in (1, 2, 3) for o in ("default", "padding")},
    **{f"aten.conv_transpose{d}d.input": (1, 2, 6, True) for d in (1, 2, 3)},
}
_LINEARS = {"aten.linear.default": (1, 2), "aten.addmm.default": (2, 0), "aten.mm.default": (1, None)}
_BINARY = {"aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
           "aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub"}
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# The ops the rewrite inserts: a policy that skips one of them gets no rewrite (the fold would
# keep the inserted nodes at runtime).
_INSERTED = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor", "aten.sub.Tensor",
                       "aten.add.Scalar", "aten.rsqrt.default", "aten.neg.default", "aten.full.default",
                       "aten.view.default", "aten.view_copy.default", "aten.expand.default",
                       "aten.expand_copy.default", "aten._to_copy.default",
                       "dim_order_ops._to_dim_order_copy.default", "aten.addmm.default"})


@dataclass(frozen=True)
class Fusion:
    """What `fuse_into_weights` did.

    Attributes:
        program: the rewritten copy, or the program itself when nothing was rewritten.
        notes: one line per rewrite, for the report (`FoldReport.rewrites`).
        decisions: a `Decision` per batch norm or binary op rewritten (`Reason.FUSED`,
            `Reason.SCALE_AND_SHIFT`) or left as it is (`Reason.NOT_FUSED`), named as in the
            program being folded; they replace the fold's own decision for that name
            (`report_builder.with_rule_decisions`).
    """

    program: ExportedProgram
    notes: tuple[str, ...] = ()
    decisions: tuple[Decision, ...] = ()


def fuse_into_weights(program: ExportedProgram, policy: FoldPolicy, bytes_before: int) -> Fusion:
    """Fold eval-mode batch norms and constant scales and shifts into the weight and bias of the
    conv or linear before them, or rewrite a batch norm as a per-channel multiply and add
    (module docstring).

    Args:
        program: the program being folded (ATen or Edge dialect); never modified.
        policy: ``fuse_into_weights`` turns the rewrite off; ``skip_targets``,
            ``max_tensor_bytes`` and the growth budget decide as for any folded value.
        bytes_before: the constant bytes `program` stores (the growth budget's reference).

    Returns:
        A `Fusion`: a copy of `program` (top-level graph copied; tensors, bodies shared) that
        the attempt then owns, or `program` itself when nothing was rewritten. A program with
        no batch norm and no binary op of a weight op's output costs one pass over its nodes.
    """
    if not policy.fuse_into_weights:
        return Fusion(program)
    stored = unchanging_stored_specs(program.graph_signature)
    candidates = _candidates(program.graph, _Constness(stored))
    if not candidates:
        return Fusion(program)
    gm, env = copy_uncompiled(program.graph_module)
    reserve_node_names(gm)
    rewriter = _Rewriter(gm.graph, _Ops.of(program), _Constness(stored), policy, policy.growth_budget(bytes_before))
    for node in candidates:
        rewriter.visit(env[node])
    if not rewriter.changed:
        return Fusion(program, (), tuple(rewriter.decisions))
    signature = _renamed_outputs(program.graph_signature, rewriter.renamed)
    return Fusion(program_with(program, graph_module=gm, graph_signature=signature), tuple(rewriter.notes),
                  tuple(rewriter.decisions))


def _candidates(graph: torch.fx.Graph, constness: "_Constness") -> list[torch.fx.Node]:
    """The nodes the rewrite starts from, in graph order: every batch norm, and each binary op
    that reads (or will read, once the rewrites before it are done) a conv or linear of a
    constant weight and, for ``add``/``sub``, a constant other operand (a residual sum is
    none). One pass over the nodes, one name per distinct target."""
    kinds: dict = {}
    feeds: set[torch.fx.Node] = set()  # values that are, or may become, a weight op's output
    out = []
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        kind = kinds.get(n.target)
        if kind is None:
            kind = kinds[n.target] = _kind(n.target)
        if kind == "bn":
            out.append(n)
            if n.args and n.args[0] in feeds:
                feeds.add(n)
        elif kind == "getitem":
            if n.args[0] in feeds and n.args[1] == 0:
                feeds.add(n)
        elif kind == "weight":
            w_op = _weight_op(n)
            if w_op is not None and constness(w_op.weight) is None:
                feeds.add(n)
        elif kind and len(n.args) >= 2:
            a, b = n.args[0], n.args[1]
            pairs = ((a, b), (b, a)) if kind in ("mul", "add") else ((a, b),)
            if any(op in feeds and (kind in ("mul", "div") or constness(c) is None) for op, c in pairs):
                out.append(n)
                feeds.add(n)
    return out


def _kind(target) -> str:
    """What the candidate search sees in a call target: a batch norm, a weight op, a getitem, a
    binary op's kind, or nothing (empty)."""
    if target is operator.getitem:
        return "getitem"
    name = op_name(target)
    if name in _BATCH_NORMS or name in _TRAINING_BATCH_NORMS:
        return "bn"
    if name in _CONVS or name in _LINEARS:
        return "weight"
    return _BINARY.get(name, "")


def _operands(node: torch.fx.Node, kind: str, constness: "_Constness") -> tuple:
    """(weight op, other operand) of a binary op that reads a conv or linear of a constant
    weight (either side of a ``mul`` or ``add``; the left of a ``div`` or ``sub``), else
    (None, None)."""
    if len(node.args) < 2:
        return None, None
    a, b = node.args[0], node.args[1]
    for op, c in ((a, b), (b, a)) if kind in ("mul", "add") else ((a, b),):
        w_op = _weight_op(op)
        if w_op is not None and constness(w_op.weight) is None:
            return op, c
    return None, None


class _Constness:
    """Whether a value is constant (module docstring): ``constness(node)`` is None when it is,
    else what it is (a row's detail). Memoised per node; nodes the rewrite inserts (`made`)
    are constant."""

    def __init__(self, stored: dict) -> None:
        self.stored = stored
        self.made: set[torch.fx.Node] = set()
        self.memo: dict[torch.fx.Node, Optional[str]] = {}

    def __call__(self, node: Any) -> Optional[str]:
        if node is None or isinstance(node, (int, float)) and not isinstance(node, bool):
            return None
        if not isinstance(node, torch.fx.Node):
            return f"a {type(node).__name__}"
        if node in self.made:
            return None
        if node not in self.memo:
            self.memo[node] = self._why(node)
        return self.memo[node]

    def _why(self, node: torch.fx.Node) -> Optional[str]:
        if node.op == "placeholder":
            return None if node.name in self.stored else "a runtime input or a mutated buffer"
        if node.op != "call_function":
            return "not a stored constant"
        if is_dequantize(node.target) or is_quantize(node.target):
            return "quantized (read through a quantize or dequantize)"
        if op_facts(node.target).kind is not OpKind.PURE:
            return f"computed by {op_name(node.target)}"
        return next((w for w in map(self, node.all_input_nodes) if w is not None), None)


@dataclass(frozen=True)
class _Ops:
    """The program dialect's ops for what the rewrite inserts."""

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
    edge: bool

    @staticmethod
    def of(program: ExportedProgram) -> "_Ops":
        if getattr(program, "dialect", "ATEN") != "EDGE":
            a = torch.ops.aten
            return _Ops(a.mul.Tensor, a.div.Tensor, a.add.Tensor, a.sub.Tensor, a.add.Scalar, a.rsqrt.default,
                        a.neg.default, a.full.default, a.view.default, a.expand.default, a.addmm.default, False)
        from executorch.exir.dialects._ops import ops as exir_ops

        e = exir_ops.edge.aten
        return _Ops(e.mul.Tensor, e.div.Tensor, e.add.Tensor, e.sub.Tensor, e.add.Scalar, e.rsqrt.default,
                    e.neg.default, e.full.default, e.view_copy.default, e.expand_copy.default, e.addmm.default, True)

    def cast(self, dtype: torch.dtype):
        """(target, kwargs) of a dtype cast in this dialect."""
        if self.edge:
            from executorch.exir.dialects._ops import ops as exir_ops

            return exir_ops.edge.dim_order_ops._to_dim_order_copy.default, {"dtype": dtype}
        return torch.ops.aten._to_copy.default, {"dtype": dtype}


@dataclass(frozen=True)
class _WeightOp:
    """A conv or linear whose output channels the rewrite scales.

    Attributes:
        node: the op; weight, bias: their argument nodes (bias None when it has none).
        bias_index: where its bias goes (positional).
        layout: ``"conv"`` (weight (out, in/G, *k)), ``"conv_t"`` (weight (in, out/G, *k)),
            ``"linear"`` (weight (out, in)) or ``"matrix"`` (addmm/mm: matrix (in, out)).
        groups: the conv's groups (1 for a linear).
        channels: output channels.
    """

    node: torch.fx.Node
    weight: torch.fx.Node
    bias: Optional[torch.fx.Node]
    bias_index: int
    layout: str
    groups: int
    channels: int


def _arg(node: torch.fx.Node, index: int, name: str, default=None):
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def _weight_op(node: Any) -> Optional[_WeightOp]:
    """`node` as a `_WeightOp`, or None when it is not a conv or linear of a static weight."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    name = op_name(node.target)
    if name in _CONVS:
        w_i, b_i, g_i, transposed = _CONVS[name]
        if not isinstance(transposed, bool):
            transposed = _arg(node, transposed, "transposed", False)
        layout, groups = ("conv_t" if transposed else "conv"), _arg(node, g_i, "groups", 1)
    elif name in _LINEARS:
        w_i, b_i = _LINEARS[name]
        layout, groups = ("linear" if name == "aten.linear.default" else "matrix"), 1
        if name == "aten.addmm.default" and (_arg(node, 3, "beta", 1) != 1 or _arg(node, 4, "alpha", 1) != 1):
            return None
    else:
        return None
    weight = _arg(node, w_i, "weight")
    bias = _arg(node, b_i, "bias") if b_i is not None else None
    w_val = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if not isinstance(w_val, torch.Tensor) or not isinstance(groups, int) or w_val.dim() < 2:
        return None
    shape = list(w_val.shape)
    channels = {"conv": shape[0], "conv_t": shape[1] * groups, "linear": shape[0], "matrix": shape[-1]}[layout]
    if not all(isinstance(d, int) for d in shape) or (bias is not None and not isinstance(bias, torch.fx.Node)):
        return None
    if bias is not None and tuple(bias.meta["val"].shape) != (channels,):
        return None  # an addmm's broadcast bias: not a per-channel vector
    return _WeightOp(node, weight, bias, b_i if b_i is not None else 0, layout, groups, channels)


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _renamed_outputs(signature: ExportGraphSignature, renamed: dict[str, str]) -> ExportGraphSignature:
    """`signature` with each user output naming a key of `renamed` naming its value instead."""
    if not renamed:
        return signature
    specs = [dataclasses.replace(s, arg=dataclasses.replace(s.arg, name=renamed[s.arg.name]))
             if s.kind == OutputKind.USER_OUTPUT and getattr(s.arg, "name", None) in renamed else s
             for s in signature.output_specs]
    return ExportGraphSignature(input_specs=list(signature.input_specs), output_specs=specs)


class _NotFused(Exception):
    """Why a candidate is left as it is (the `Reason.NOT_FUSED` row's detail)."""


class _Rewriter:
    """The rewrite of one graph, node by node in graph order (`visit`); its records are the
    `Fusion`'s."""

    def __init__(self, graph, ops: _Ops, constness: _Constness, policy: FoldPolicy, budget: Optional[int]) -> None:
        self.graph, self.ops, self.constness = graph, ops, constness
        self.policy, self.budget, self.spent = policy, budget, 0
        self.skip = policy.skip_names()
        self.skipped = sorted(_INSERTED & self.skip)
        self.made = constness.made  # the constant nodes this rewrite inserted
        self.dead: set[torch.fx.Node] = set()
        self.renamed: dict[str, str] = {}
        self.notes: list[str] = []
        self.decisions: list[Decision] = []
        self.changed = False
        self.taken = {n.name for n in graph.nodes}

    # --- the two kinds of candidate -------------------------------------------------------

    def visit(self, node: torch.fx.Node) -> None:
        if node in self.dead:
            return
        name = op_name(node.target)
        try:
            if name in _TRAINING_BATCH_NORMS:
                raise _NotFused("training-mode batch norm (batch statistics)")
            if name in _BATCH_NORMS:
                self._batch_norm(node, name)
            elif name in _BINARY:
                self._binary(node, _BINARY[name])
        except _NotFused as why:
            self.decisions.append(Decision(node.name, name, Reason.NOT_FUSED, str(why)))

    def _batch_norm(self, bn: torch.fx.Node, name: str) -> None:
        w_i, b_i, m_i, v_i, e_i, t_i, tuple_result = _BATCH_NORMS[name]
        if t_i is not None and _arg(bn, t_i, "training", False):
            raise _NotFused("training-mode batch norm (batch statistics)")
        out = self._bn_output(bn, tuple_result)
        x = bn.args[0]
        gamma, beta = _arg(bn, w_i, "weight"), _arg(bn, b_i, "bias")
        mean, var, eps = _arg(bn, m_i, "running_mean"), _arg(bn, v_i, "running_var"), _arg(bn, e_i, "eps")
        x_val = _val(x)
        if not isinstance(x_val, torch.Tensor) or x_val.dtype not in _FLOATS or x_val.dim() < 2:
            raise _NotFused("input is not a floating-point tensor of rank >= 2")
        if not isinstance(x_val.shape[1], int):
            raise _NotFused(f"symbolic channel count {x_val.shape[1]}")
        if self._skipped(bn):
            raise _NotFused(self._skip_detail(bn))
        if mean is None or var is None or not isinstance(eps, (int, float)):
            raise _NotFused("no running statistics")
        for what, v in (("weight", gamma), ("bias", beta), ("running mean", mean), ("running variance", var)):
            self._require_constant(v, f"batch norm {what}")
        if is_dequantize(getattr(x, "target", None)) or any(is_quantize(u.target) for u in out.users):
            raise _NotFused("quantized operands: a quantize/dequantize pair at the batch norm (its encoding "
                            "was chosen for the batch norm's output; rewriting it would need another)")
        stats = (gamma, beta, mean, var, float(eps))
        why_not = self._fusible(x, "batch norm")
        if why_not is None and _weight_op(x).channels != x_val.shape[1]:
            why_not = f"{x.name} has {_weight_op(x).channels} output channels, the batch norm {x_val.shape[1]}"
        if why_not is None:
            self._fuse_batch_norm(bn, out, _weight_op(x), stats)
        else:
            self._scale_and_shift(bn, out, x, stats, why_not)

    def _bn_output(self, bn: torch.fx.Node, tuple_result: bool) -> torch.fx.Node:
        """The node whose value is the normalised tensor: `bn`, or its only ``getitem(bn, 0)``."""
        if not tuple_result:
            return bn
        getitems = [u for u in bn.users if u.target is operator.getitem]
        if len(getitems) != len(bn.users) or any(u.args[1] != 0 for u in getitems) or len(getitems) != 1:
            raise _NotFused("its saved statistics (outputs 1 and 2) are read")
        return getitems[0]

    def _binary(self, node: torch.fx.Node, kind: str) -> None:
        alpha = _arg(node, 2, "alpha", 1)
        op, c = _operands(node, kind, self.constness)
        w_op = _weight_op(op)
        if w_op is None:
            return  # a rewrite before changed what it reads
        if alpha != 1:
            raise _NotFused(f"alpha={alpha}")
        if isinstance(c, torch.fx.Node) and self.constness(c) is not None:
            if kind in ("add", "sub"):
                return  # a residual or another runtime sum, not a shift
            raise _NotFused(f"runtime scale: {c.name} is {self.constness(c)}")
        if self._skipped(node):
            raise _NotFused(self._skip_detail(node))
        why_not = self._fusible(op, f"{kind} by a constant")
        if why_not is not None:
            raise _NotFused(why_not)
        node.prepend(op)  # after every constant the binary op reads (only `node` reads the op)
        with self.graph.inserting_before(op):
            c_vec = self._channel_vector(c, node, w_op)
        self._fuse_binary(node, w_op, kind, c_vec)

    # --- conditions ------------------------------------------------------------------------

    def _require_constant(self, node: Any, what: str) -> None:
        why = self.constness(node)
        if why is not None:
            prefix = "quantized operands: " if why.startswith("quantized") else "runtime operand: "
            raise _NotFused(f"{prefix}{what} {getattr(node, 'name', node)} is {why}")

    def _fusible(self, x: Any, what: str) -> Optional[str]:
        """None when the weight op `x` can take a `what` into its weight and bias, else why not."""
        w_op = _weight_op(x)
        if w_op is None:
            return f"reads {getattr(x, 'name', x)} ({op_name(getattr(x, 'target', ''))}), not a conv or linear"
        users = [u.name for u in x.users]
        if len(users) != 1:
            return f"{x.name}'s output is also read by {', '.join(u for u in users[:4])}"
        if w_op.layout == "linear" and _val(x).dim() != 2:
            if what == "batch norm":
                return f"{x.name} is a linear of a rank-{_val(x).dim()} input: its channels are not dim 1"
        if self._skipped(x):
            return self._skip_detail(x)
        for role, v in (("weight", w_op.weight), ("bias", w_op.bias)):
            why = self.constness(v)
            if why is not None:
                return f"{'quantized operands' if why.startswith('quantized') else 'runtime operand'}: " \
                       f"{x.name}'s {role} {v.name} is {why}"
        w_val = _val(w_op.weight)
        if w_val.dtype not in _FLOATS or _val(x).dtype != w_val.dtype:
            return f"{x.name}'s weight is {w_val.dtype}"
        cap = self.policy.max_tensor_bytes
        if cap is not None and nbytes(w_val) > cap:
            return f"{x.name}'s weight ({nbytes(w_val)} bytes) is above FoldPolicy.max_tensor_bytes"
        shared = self._shared_bytes(w_op)
        if shared and self.budget is not None and self.spent + shared > self.budget:
            return f"{x.name}'s weight is also read by other ops; a copy ({shared} bytes) exceeds the growth budget"
        return None

    def _shared_bytes(self, w_op: _WeightOp) -> int:
        """Bytes of the weight and bias that stay stored for other readers when this op reads
        new ones (0 when only `w_op` reads them)."""
        total = 0
        for v in (w_op.weight, w_op.bias):
            if v is None or v in self.made:
                continue
            ancestry = self._ancestry(v)
            if any(u is not w_op.node and u not in ancestry for a in ancestry for u in a.users):
                total += nbytes(_val(v))
        return total

    @staticmethod
    def _ancestry(node: torch.fx.Node) -> set:
        seen, todo = set(), [node]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(n.all_input_nodes)
        return seen

    def _skipped(self, node: torch.fx.Node) -> bool:
        return bool(self.skipped) or op_name(node.target) in self.skip or \
            op_name(node.target).rsplit(".", 1)[0] in self.skip

    def _skip_detail(self, node: torch.fx.Node) -> str:
        names = self.skipped or [op_name(node.target)]
        return f"FoldPolicy.skip_targets holds {', '.join(names)}"

    # --- the rewrites ----------------------------------------------------------------------

    def _fuse_batch_norm(self, bn, out, w_op: _WeightOp, stats) -> None:
        gamma, beta, mean, var, eps = stats
        bn.prepend(w_op.node)  # after every constant the batch norm reads (only `bn` reads the op)
        with self.graph.inserting_before(w_op.node):
            r = self._rsqrt(var, eps, w_op)
            s = self._make(self.ops.mul, (self._compute(gamma, w_op), r), f"{bn.name}_scale") if gamma is not None else r
            weight = self._scaled_weight(w_op, self.ops.mul, s, f"{w_op.node.name}_fused_weight")
            b = self._make(self.ops.neg, (self._compute(mean, w_op),), f"{bn.name}_neg_mean") if w_op.bias is None \
                else self._make(self.ops.sub, (self._compute(w_op.bias, w_op), self._compute(mean, w_op)), f"{bn.name}_centred")
            b = self._make(self.ops.mul, (b, r), f"{bn.name}_shift")
            if gamma is not None:
                b = self._make(self.ops.mul, (b, self._compute(gamma, w_op)), f"{bn.name}_scaled_shift")
            if beta is not None:
                b = self._make(self.ops.add, (b, self._compute(beta, w_op)), f"{bn.name}_shifted")
            bias = self._stored_dtype(b, w_op, f"{w_op.node.name}_fused_bias")
        fused = self._replace_operands(w_op, weight, bias)
        rows = [Decision(n.name, op_name(n.target), Reason.FUSED, f"into {fused.name}") for n in dict.fromkeys((bn, out))]
        self.notes.append(f"{bn.name} ({op_name(bn.target)}) folded into the weight and bias of {fused.name}")
        self._replace(out, fused, [bn] if out is not bn else [])
        self.decisions.extend(rows)

    def _fuse_binary(self, node, w_op: _WeightOp, kind: str, c_vec) -> None:
        with self.graph.inserting_before(w_op.node):
            weight, bias = w_op.weight, w_op.bias
            if kind in ("mul", "div"):
                target = self.ops.mul if kind == "mul" else self.ops.div
                weight = self._scaled_weight(w_op, target, c_vec, f"{w_op.node.name}_{kind}_weight")
                if bias is not None:
                    b = self._make(target, (self._compute(bias, w_op), c_vec), f"{w_op.node.name}_{kind}_bias_value")
                    bias = self._stored_dtype(b, w_op, f"{w_op.node.name}_{kind}_bias")
            else:
                base = self._compute(bias, w_op) if bias is not None else self._zeros(w_op)
                target = self.ops.add if kind == "add" else self.ops.sub
                b = self._make(target, (base, c_vec), f"{w_op.node.name}_{kind}_bias_value")
                bias = self._stored_dtype(b, w_op, f"{w_op.node.name}_{kind}_bias")
        fused = self._replace_operands(w_op, weight, bias)
        self.notes.append(f"{node.name} ({op_name(node.target)}) folded into the weight and bias of {fused.name}")
        self.decisions.append(Decision(node.name, op_name(node.target), Reason.FUSED, f"into {fused.name}"))
        self._replace(node, fused, [])

    def _scale_and_shift(self, bn, out, x, stats, why_not: str) -> None:
        gamma, beta, mean, var, eps = stats
        x_val = _val(x)
        compute = _compute_dtype(x_val.dtype)
        shape = [x_val.shape[1]] + [1] * (x_val.dim() - 2)
        with self.graph.inserting_before(bn):
            cast = lambda v: self._cast(v, compute)  # noqa: E731
            s = self._make(self.ops.rsqrt, (self._make(self.ops.add_scalar, (cast(var), eps), f"{bn.name}_var_eps"),),
                           f"{bn.name}_rsqrt")
            if gamma is not None:
                s = self._make(self.ops.mul, (cast(gamma), s), f"{bn.name}_scale")
            t = self._make(self.ops.mul, (cast(mean), s), f"{bn.name}_mean_scaled")
            t = self._make(self.ops.sub, (cast(beta), t), f"{bn.name}_shift") if beta is not None \
                else self._make(self.ops.neg, (t,), f"{bn.name}_shift")
            s = self._make(self.ops.view, (self._cast(s, x_val.dtype), shape), f"{bn.name}_scale_view")
            t = self._make(self.ops.view, (self._cast(t, x_val.dtype), shape), f"{bn.name}_shift_view")
            scaled = self._runtime(self.ops.mul, (x, s), f"{bn.name}_scaled", bn)
            shifted = self._runtime(self.ops.add, (scaled, t), f"{out.name}_shifted", bn)
        out.replace_all_uses_with(shifted)
        name = out.name
        for n in dict.fromkeys((out, bn)):
            self.dead.add(n)
        self._erase(out, bn)
        keep_name(shifted, name)
        self.changed = True
        self.notes.append(f"{bn.name} ({op_name(bn.target)}) rewritten as a per-channel multiply and add "
                          f"(not fused into a weight: {why_not})")
        if bn is not out:
            self.decisions.append(Decision(bn.name, op_name(bn.target), Reason.SCALE_AND_SHIFT, why_not))
        else:
            self.decisions.append(Decision(name, op_name(bn.target), Reason.SCALE_AND_SHIFT, why_not))

    # --- node helpers ----------------------------------------------------------------------

    def _channel_vector(self, c, node, w_op: _WeightOp):
        """`c` as a constant node of shape ``[channels]`` in the compute dtype, or `_NotFused`
        when it does not broadcast along the output channels of `w_op` only."""
        compute = _compute_dtype(_val(w_op.weight).dtype)
        channels = w_op.channels
        if isinstance(c, (int, float)) and not isinstance(c, bool):
            if not math.isfinite(float(c)):
                raise _NotFused(f"non-finite constant {c}")
            return self._make(self.ops.full, ([channels], float(c)), f"{node.name}_constant",
                              dtype=compute, device=torch.device("cpu"))
        c_val = _val(c)
        out_val, op_val = _val(node), _val(w_op.node)
        if not isinstance(c_val, torch.Tensor) or c_val.dtype not in _FLOATS + (torch.int32, torch.int64) \
                or tuple(out_val.shape) != tuple(op_val.shape) or out_val.dtype != op_val.dtype \
                or (c_val.dim() > 0 and c_val.dtype != op_val.dtype):
            raise _NotFused(f"{c.name} does not keep {w_op.node.name}'s shape and dtype")
        axis = 1 if w_op.layout in ("conv", "conv_t") else op_val.dim() - 1
        padded = [1] * (op_val.dim() - c_val.dim()) + list(c_val.shape)
        if c_val.dim() > op_val.dim() or any(d != 1 for i, d in enumerate(padded) if i != axis) \
                or padded[axis] not in (1, channels):
            raise _NotFused(f"{c.name} of shape {list(c_val.shape)} does not broadcast per output channel "
                            f"(dim {axis}) of {w_op.node.name}")
        flat = self._make(self.ops.view, (self._cast(c, compute), [-1]), f"{node.name}_vector")
        if padded[axis] == 1:
            flat = self._make(self.ops.expand, (flat, [channels]), f"{node.name}_expanded")
        return flat

    def _rsqrt(self, var, eps: float, w_op: _WeightOp):
        v = self._compute(var, w_op)
        return self._make(self.ops.rsqrt, (self._make(self.ops.add_scalar, (v, eps), f"{var.name}_eps"),),
                          f"{var.name}_rsqrt")

    def _scaled_weight(self, w_op: _WeightOp, target, s, name: str):
        """`w_op`'s weight times (or divided by) the per-channel vector `s`, along its
        output-channel axis, cast back to the weight's dtype."""
        w_val = _val(w_op.weight)
        rank, shape = w_val.dim(), list(w_val.shape)
        ones = [1] * (rank - 2)
        w = w_op.weight
        if w_op.layout == "conv_t" and w_op.groups > 1:
            g = w_op.groups
            w = self._make(self.ops.view, (w, [g, shape[0] // g] + shape[1:]), f"{name}_grouped")
            s = self._make(self.ops.view, (s, [g, 1, shape[1]] + ones), f"{name}_scale")
        else:
            view = {"conv": [-1, 1] + ones, "conv_t": [1, -1] + ones, "linear": [-1, 1], "matrix": [1, -1]}
            s = self._make(self.ops.view, (s, view[w_op.layout]), f"{name}_scale")
        w = self._make(target, (w, s), f"{name}_value")
        if w_op.layout == "conv_t" and w_op.groups > 1:
            w = self._make(self.ops.view, (w, shape), f"{name}_ungrouped")
        return self._renamed(self._cast(w, w_val.dtype), name)

    def _compute(self, v, w_op: _WeightOp):
        return self._cast(v, _compute_dtype(_val(w_op.weight).dtype))

    def _stored_dtype(self, b, w_op: _WeightOp, name: str):
        """`b` cast to the dtype of `w_op`'s bias (or weight), its last node named `name` (the
        lifted constant's name: ``c_folded_<name>``)."""
        dtype = _val(w_op.bias).dtype if w_op.bias is not None else _val(w_op.weight).dtype
        return self._renamed(self._cast(b, dtype), name)

    def _renamed(self, node: torch.fx.Node, base: str) -> torch.fx.Node:
        if node.name != base and node in self.made:
            name = unique_name(base, self.taken)
            self.taken.add(name)
            keep_name(node, name)
        return node

    def _zeros(self, w_op: _WeightOp):
        return self._make(self.ops.full, ([w_op.channels], 0.0), f"{w_op.node.name}_zero_bias",
                          dtype=_compute_dtype(_val(w_op.weight).dtype), device=torch.device("cpu"))

    def _cast(self, v, dtype: torch.dtype):
        if _val(v).dtype == dtype:
            return v
        target, kwargs = self.ops.cast(dtype)
        return self._make(target, (v,), f"{v.name}_{str(dtype).split('.')[-1]}", **kwargs)

    def _make(self, target, args, base: str, **kwargs) -> torch.fx.Node:
        node = self._node(target, args, kwargs, base, None)
        self.made.add(node)
        return node

    def _runtime(self, target, args, base: str, like: torch.fx.Node) -> torch.fx.Node:
        return self._node(target, args, {}, base, like)

    def _node(self, target, args, kwargs, base: str, like: Optional[torch.fx.Node]) -> torch.fx.Node:
        name = unique_name(base, self.taken)
        self.taken.add(name)
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        if like is not None:
            node.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta", "unbacked_bindings")}
        vals = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
        fake = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
        with fake or contextlib.nullcontext():
            node.meta["val"] = target(*vals, **kwargs)
        return node

    def _replace_operands(self, w_op: _WeightOp, weight, bias) -> torch.fx.Node:
        """`w_op` reading `weight` and `bias`: the node itself, or the ``addmm`` (with its
        name) that replaces an ``mm`` given a bias."""
        node = w_op.node
        name = op_name(node.target)
        self.spent += self._shared_bytes(w_op)
        if name == "aten.mm.default" and bias is not None:  # a bias for a linear without one: addmm
            with self.graph.inserting_before(node):
                addmm = self._runtime(self.ops.addmm, (bias, node.args[0], weight), f"{node.name}_addmm", node)
            node.replace_all_uses_with(addmm)
            old = node.name
            self._erase(node)
            return keep_name(addmm, old)
        args = list(node.args)
        w_i = _CONVS[name][0] if name in _CONVS else _LINEARS[name][0]
        args[w_i] = weight
        if bias is not None:
            while len(args) <= w_op.bias_index:
                args.append(None)
            args[w_op.bias_index] = bias
        node.args = tuple(args)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k not in ("weight", "bias")}
        return node

    def _replace(self, old: torch.fx.Node, new: torch.fx.Node, extra: list) -> None:
        """Every reader of `old` reads `new`; `old` and `extra` (the batch norm of a getitem)
        leave the graph; an output spec naming `old` names `new`."""
        if any(u.op == "output" for u in old.users):
            self.renamed[old.name] = new.name
        old.replace_all_uses_with(new)
        self.dead.update([old, *extra])
        self._erase(old, *extra)
        self.changed = True

    def _erase(self, *nodes: torch.fx.Node) -> None:
        for n in nodes:
            if not n.users:
                self.graph.erase_node(n)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16 and bf16 values are computed in fp32 (as eager's batch norm kernels do)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
