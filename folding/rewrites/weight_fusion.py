"""Batch norms and constant scales and shifts folded into the weight and bias of the conv or
linear before them: a rewrite of the working program before analysis, in its own dialect (ATen
or Edge), by three formulas (`weight_ops`) whose constant-only nodes the fold evaluates, budgets
and stores like any other:

1. ``bn(op(x, W, b))`` -> ``op(x, W * s, (b - mean) * r * gamma + beta)``, ``r = rsqrt(var +
   eps)``, ``s = gamma * r`` per output channel (torch.nn.utils.fusion.fuse_conv_bn_weights).
   ``op``: a conv (1d/2d/3d, grouped, transposed), a ``linear``, Edge's ``addmm``/``mm`` (an
   ``mm`` given a bias becomes an ``addmm``);
2. ``op(x) * c``, ``/ c``, ``+ c``, ``- c``, ``c`` a number or a tensor along the output channels
   only -> ``W * c`` / ``W / c`` and ``b <op> c`` (Inductor's fx_passes/binary_folding.py);
3. a lone batch norm -> ``(x - centre) * s + t`` by per-channel constants, which every backend
   computes right (QNN's BatchNorm builder ignores ``eps``: executorch 1.5.1
   backends/qualcomm/builders/op_batch_norm.py).

A formula computes in the widest of its operands' dtypes, at least fp32, and rounds once
(`weight_ops.compute_dtype`).

Preconditions, each refusal a `Reason.NOT_FUSED` row (or `Reason.SCALE_AND_SHIFT` saying why 1.
did not apply): operands known before evaluation (numbers; stored tensors no op writes
(`unchanging.unchanging_before_probes`), directly or through a view, cast or clone); an
eval-mode batch norm, finite statistics with ``var + eps > 0``, no q/dq at it, static channels
on dim 1; a float weight op only the batch norm or binary op reads, nothing between them
writing in place or with side effects, its weight within ``max_tensor_bytes``; no inserted op
in ``skip_targets``; the growth budget kept. And values that keep eager's results:

- a factor ``f`` (``c``, ``1 / c``, the batch norm's ``s``) finite and nonzero, the weight and
  bias finite: ``W * 0`` loses the sign of ``(W x) * 0`` and the NaN of ``inf * 0``;
- ``W * f`` and the new bias finite in their dtype, each channel's largest ``|W * f|`` (and a
  nonzero bias times ``f``) a normal number;
- ``|f| > 1`` makes the op's partial sums larger than eager's: refused in fp16/bf16 (ATen's CPU
  kernels keep some in the low precision), elsewhere when ``K max|W * f| + |b'|`` (fan-in K)
  reaches ``sqrt(max)``;
- a shift finite, ``b + c`` finite in the bias's dtype.

Rounding in fp16/bf16 (unit roundoff u): the fused op rounds ``b'``, which in a quiet channel
(``|mean| >> sqrt(var + eps)``) cancels most of ``W' x``. The output is about ``|beta| + |gamma|
z``, ``|z|`` a few, so ``|b'| <= CANCELLATION_RATIO (|beta| + |gamma|)`` bounds the extra error
by ``u (8 (|beta| + |gamma|) + |out|)``. Formula 3 is ``(x - mean) * s + beta`` there, which
needs ``mean`` and ``beta`` exact in the activations' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from ..core.dialect import dialect_op
from ..control_flow.hops import copy_uncompiled
from ..core.names import reserve_node_names, with_renamed_outputs
from ..core.ops import OpKind, arg_at, op_facts, op_name, written_arg_positions
from ..policy import FoldPolicy
from ..core.quant import is_dequantize, is_quantize
from ..reasons import Reason
from ..report import Decision
from ..core.signature import input_specs_by_name
from ..core.sizes import aligned, nbytes, stored_tensor
from ..core.torch_internals import program_with
from ..core.unchanging import unchanging_before_probes
from .weight_ops import (BATCH_NORMS, BINARY, FLOATS, OPS, TRAINING_BATCH_NORMS, Eager, NodeMaker,
                         WeightOp, aten_op, batch_norm_output, binary_bias, bn_bias, bn_scale, compute_dtype,
                         scale_and_shift, scaled_weight, val, weight_op)

CANCELLATION_RATIO = 8.0  # module docstring, "Rounding"
_LOW = (torch.float16, torch.bfloat16)
# Ops whose value is their input's, moved or cast (`_Rewrite.value`); Edge's copies read as views.
_VIEWS = {**{f"aten.{v}{c}.{o}": f"aten.{v}.{o}" for v, o in (("permute", "default"), ("t", "default"),
                                                             ("transpose", "int")) for c in ("", "_copy")},
          **{f"aten.{v}.default": "aten.reshape.default" for v in ("view", "view_copy", "reshape", "_unsafe_view")}}
_LOOKED_THROUGH = frozenset({*_VIEWS, "aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default",
                             "aten.detach.default", "aten._to_copy.default", "dim_order_ops._clone_dim_order.default",
                             "dim_order_ops._to_dim_order_copy.default"})


@dataclass(frozen=True)
class FusionRows:
    """The rewrite's report rows: `decisions` (`Reason.FUSED`, `SCALE_AND_SHIFT` or `NOT_FUSED`
    per batch norm, its getitem, or binary op) replace the fold's for their names; the fold's
    rows of the `inserted` nodes are dropped unless one was kept although constant-only."""

    decisions: tuple[Decision, ...] = ()
    inserted: frozenset = frozenset()


@dataclass(frozen=True)
class Fusion:
    """What `fuse_into_weights` did: the `program` (a rewritten copy, or the program itself),
    `notes` (`FoldReport.rewrites`), `rows`, and `replaced`: ``(old, new)`` node names in rewrite
    order, `new` computing the value of `old`."""

    program: ExportedProgram
    notes: tuple[str, ...] = ()
    rows: FusionRows = FusionRows()
    replaced: tuple[tuple[str, str], ...] = ()


def fuse_into_weights(program: ExportedProgram, policy: FoldPolicy, bytes_before: int, spent: int = 0) -> Fusion:
    """The rewrite (module docstring) of `program` (ATen or Edge; never modified) under `policy`
    (``fuse_into_weights``, ``skip_targets``, ``max_tensor_bytes``, the growth budget of a
    caller's program storing `bytes_before` bytes, `spent` of it by earlier rounds).

    Returns a `Fusion` whose program is a copy (top-level graph copied, tensors and bodies
    shared), or `program` itself when nothing was rewritten."""
    names = {**{n: "bn" for n in BATCH_NORMS}, **{n: "training" for n in TRAINING_BATCH_NORMS}, **BINARY}
    kinds = {t: k for n, k in names.items() if (t := dialect_op(program, n)) is not None} \
        if policy.fuse_into_weights else {}
    graph = program.graph
    if not any(k in ("bn", "training") or any(weight_op(a) or op_name(getattr(a, "target", "")) in _VIEWS
                                              and weight_op(a.args[0]) for a in n.args[:2])
               for t, k in kinds.items() for n in graph.find_nodes(op="call_function", target=t)):
        return Fusion(program)
    gm, _ = copy_uncompiled(program.graph_module)
    reserve_node_names(gm)
    rw = _Rewrite(program, gm, policy, bytes_before, max(spent, 0))
    for node in list(gm.graph.nodes):
        kind = kinds.get(node.target) if node.op == "call_function" and node not in rw.dead else None
        rw.make.prefix = f"{node.name}_"
        try:
            if kind == "training":
                raise _NotFused("training-mode batch norm (batch statistics)")
            _batch_norm(rw, node) if kind == "bn" else _binary(rw, node, kind) if kind in BINARY.values() else None
        except _NotFused as why:
            rw.row(node, Reason.NOT_FUSED, str(why))
    rows = FusionRows(tuple(rw.decisions), rw.make.inserted_names() if rw.replaced else frozenset())
    if not rw.replaced:
        return Fusion(program, (), rows)
    signature = with_renamed_outputs(program.graph_signature, rw.renamed)
    return Fusion(program_with(program, graph_module=gm, graph_signature=signature), tuple(rw.notes), rows,
                  tuple(rw.replaced))


class _NotFused(Exception):
    """Why a candidate is left as it is (the row's detail)."""


class _Rewrite:
    """One graph's rewrite: what is known of its values, the growth budget, and the records."""

    def __init__(self, program: ExportedProgram, gm: torch.fx.GraphModule, policy: FoldPolicy, bytes_before: int,
                 spent: int) -> None:
        self.program, self.graph, self.policy = program, gm.graph, policy
        self.make = NodeMaker(gm.graph, {k: dialect_op(program, v) for k, v in OPS.items()})
        self.stored = unchanging_before_probes(program)
        self.budget, self.spent, self.skip = policy.growth_budget(bytes_before), spent, policy.skip_names()
        self.skipped = sorted({op_name(t) for t in self.make.ops.values()} & self.skip)
        self.values: dict[Any, Optional[torch.Tensor]] = {}  # known values, new biases' too
        self.amax: dict[torch.fx.Node, torch.Tensor] = {}  # per-channel max |W|, new weights' too
        self.by_shape: Optional[dict] = None
        self.dead: set[torch.fx.Node] = set()
        self.renamed: dict[str, str] = {}
        self.replaced: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.decisions: list[Decision] = []

    def value(self, v: Any) -> Optional[torch.Tensor]:
        """`v`'s value known before evaluation (module docstring), or None."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return torch.tensor(float(v), dtype=torch.float64)
        if not isinstance(v, torch.fx.Node):
            return None
        if v not in self.values:
            name, inner = op_name(v.target) if v.op == "call_function" else "", None
            if v.op == "placeholder" and v.name in self.stored:
                inner = stored_tensor(self.stored[v.name], self.program.state_dict, self.program.constants).detach()
            elif name in _LOOKED_THROUGH and (inner := self.value(v.args[0])) is not None:
                inner = inner.to(v.kwargs.get("dtype") or inner.dtype)
                inner = aten_op(_VIEWS[name])(inner, *v.args[1:]) if name in _VIEWS else inner
            self.values[v] = inner
        return self.values[v]

    def require(self, v: Any, what: str) -> Optional[torch.Tensor]:
        """`v`'s known value (None for None), else `_NotFused` saying why it is not known."""
        if v is None or self.value(v) is not None:
            return self.value(v)
        n = v
        while getattr(n, "op", None) == "call_function" and op_name(n.target) in _LOOKED_THROUGH:
            n = n.args[0]
        if getattr(n, "op", None) == "placeholder":
            raise _NotFused(f"runtime operand: {what} {v.name} is a runtime input or a mutated buffer")
        if is_dequantize(getattr(n, "target", None)) or is_quantize(getattr(n, "target", None)):
            raise _NotFused(f"quantized operands: {what} {v.name} is read through {n.name}")
        raise _NotFused(f"computed operand: {what} {getattr(v, 'name', v)} is computed by "
                        f"{op_name(getattr(n, 'target', n))}: its values are known only once evaluated")

    def require_not_skipped(self, node: torch.fx.Node) -> None:
        name = op_name(node.target)
        if self.skipped or name in self.skip or name.rsplit(".", 1)[0] in self.skip:
            raise _NotFused(f"FoldPolicy.skip_targets holds {', '.join(self.skipped or [name])}")

    def fits(self, added: int, freed: list) -> bool:
        """Whether storing `added` more bytes while dropping `freed` (``(operand, reader)``s)
        keeps the growth budget; spends it when it does."""
        growth = added - sum(self._saved(v, reader) for v, reader in freed)
        if self.budget is not None and self.spent + growth > self.budget:
            return False
        self.spent += growth
        return True

    def _saved(self, v: Any, reader: torch.fx.Node) -> int:
        """Bytes dropping `v` saves: its stored tensor's when only `reader` reads it (through its
        views) and no other stored tensor holds the same bytes (the `.pte` stores those once)."""
        while getattr(v, "op", None) == "call_function" and v not in self.make.created and set(v.users) == {reader}:
            reader, v = v, v.args[0]
        if not isinstance(v, torch.fx.Node) or set(v.users) != {reader}:
            return 0
        if v in self.make.created:
            return aligned(nbytes(val(v)))
        t = self.value(v) if v.op == "placeholder" else None
        if t is None or any(name != v.name and torch.equal(u.reshape(-1)[:64], t.reshape(-1)[:64])
                            and torch.equal(u, t) for name, u in self._same_shape(t)):
            return 0
        return aligned(nbytes(t))

    def _same_shape(self, t: torch.Tensor) -> list:
        if self.by_shape is None:
            self.by_shape, p = {}, self.program
            for name, spec in input_specs_by_name(p.graph_signature).items():
                u = stored_tensor(spec, p.state_dict, p.constants)
                if isinstance(u, torch.Tensor):
                    self.by_shape.setdefault((u.dtype, tuple(u.shape)), []).append((name, u.detach()))
        return self.by_shape.get((t.dtype, tuple(t.shape)), [])

    def row(self, node: torch.fx.Node, reason: Reason, detail: str) -> None:
        self.decisions.append(Decision(node.name, op_name(node.target), reason, detail))

    def replace(self, out: torch.fx.Node, new: torch.fx.Node, removed: list, reason: Reason, detail: str) -> None:
        """The readers of `out` read `new` (an output spec naming `out` names `new`); `removed`
        leave the graph, each with a row."""
        for n in removed:
            self.row(n, reason, detail)
        if any(u.op == "output" for u in out.users):
            self.renamed[out.name] = new.name
        self.replaced.append((out.name, new.name))
        out.replace_all_uses_with(new)
        for n in reversed(removed):
            self.dead.add(n)
            self.graph.erase_node(n)


def _batch_norm(rw: _Rewrite, bn: torch.fx.Node) -> None:
    """Formula 1 when its preconditions hold, else 3, else `_NotFused`."""
    w_i, b_i, m_i, v_i, e_i, t_i, tuple_result = BATCH_NORMS[op_name(bn.target)]
    out, x, x_val = batch_norm_output(bn, tuple_result), bn.args[0], val(bn.args[0])
    stats = tuple(arg_at(bn, i) for i in (w_i, b_i, m_i, v_i, e_i))
    for refused, why in ((t_i is not None and arg_at(bn, t_i), "training-mode batch norm (batch statistics)"),
                         (out is None, "its saved statistics (outputs 1 and 2) are read"),
                         (getattr(x_val, "dtype", None) not in FLOATS or x_val.dim() < 2,
                          "input is not a floating-point tensor of rank >= 2"),
                         (stats[2] is None or stats[3] is None or not isinstance(stats[4], (int, float)),
                          "no running statistics")):
        if refused:
            raise _NotFused(why)
    if not isinstance(x_val.shape[1], int):
        raise _NotFused(f"symbolic channel count {x_val.shape[1]}")
    if is_dequantize(getattr(x, "target", None)) or any(is_quantize(u.target) for u in out.users):
        raise _NotFused("quantized operands: a quantize/dequantize pair at the batch norm (its encoding was chosen "
                        "for the batch norm's output; rewriting it would need another)")
    rw.require_not_skipped(bn)
    stats = stats[:4] + (float(stats[4]),)
    known = tuple(rw.require(v, f"batch norm {what}") for v, what in
                  zip(stats, ("weight", "bias", "running mean", "running variance"))) + stats[4:]
    dtype = compute_dtype(x_val.dtype, *(v.dtype for v in known[:4] if v is not None))
    if not all(bool(v.isfinite().all()) for v in known[:4] if v is not None) \
            or not bool((known[3].to(dtype) + stats[4] > 0).all()):
        raise _NotFused("batch norm statistics hold inf or NaN, or var + eps <= 0: rewritten it would give other "
                        "non-finite values than the batch norm")
    try:
        w_op = _fusible(rw, x, batch_norm=True)
        if w_op.channels != x_val.shape[1]:
            raise _NotFused(f"{x.name} has {w_op.channels} output channels, the batch norm {x_val.shape[1]}")
        _movable(x, bn)
        r, s = bn_scale(Eager(), known[0], known[3], stats[4], dtype)
        b_new = bn_bias(Eager(), rw.value(w_op.bias), known, r, dtype)
        _products(rw, w_op, s.double(), b_new, None, "the batch norm's scale gamma / sqrt(var + eps)")
        _cancellation(w_op, known, b_new)
        _rewrite(rw, bn, out, list(dict.fromkeys((bn, out))), w_op, "mul", s.double(), b_new, [(v, bn) for v in stats[:4]],
                 lambda m: bn_scale(m, stats[0], stats[3], stats[4], dtype),
                 lambda m, r_s: (r_s[1], bn_bias(m, w_op.bias, stats, r_s[0], dtype)), dtype, "fused")
    except _NotFused as why:
        _scale_and_shift(rw, bn, out, x, stats, known, dtype, str(why))


def _cancellation(w_op: WeightOp, known: tuple, b_new: torch.Tensor) -> None:
    """`_NotFused` when an fp16/bf16 fused bias cancels most of the output (module docstring, "Rounding")."""
    b_dtype = val(w_op.bias if w_op.bias is not None else w_op.weight).dtype
    if b_dtype not in _LOW:
        return
    size = (known[0].double().abs() if known[0] is not None else 1.0) + \
        (known[1].double().abs() if known[1] is not None else 0.0)
    worst = (b_new.double().abs() / torch.as_tensor(size).clamp_min(1e-300)).max().item()
    if worst > CANCELLATION_RATIO:
        raise _NotFused(f"in {b_dtype} its folded bias would cancel most of {w_op.node.name}'s output: |b'| is "
                        f"{worst:.3g} x the channel's |beta| + |gamma| (above {CANCELLATION_RATIO:g})")


def _binary(rw: _Rewrite, node: torch.fx.Node, kind: str) -> None:
    """Formula 2 for a binary op reading a weight op of known weight, else `_NotFused` (or
    nothing: a sum with a runtime value is a residual, not a shift)."""
    a, b = node.args[:2]
    op, c = (a, b) if _known_weight(rw, a) else (b, a) if kind in ("mul", "add") and _known_weight(rw, b) else (None, b)
    if op is None:
        for v in (a, b):  # Edge's linear of a rank-3 input: view_copy -> addmm -> view_copy
            if isinstance(v, torch.fx.Node) and op_name(v.target) in _VIEWS and _known_weight(rw, v.args[0]):
                raise _NotFused(f"reads {v.args[0].name} through {v.name} (a linear of a rank-3 input, view -> addmm "
                                f"-> view): not fused")
        return
    if arg_at(node, 2) not in (None, 1):
        raise _NotFused(f"alpha={arg_at(node, 2)}")
    c_val, scaled = rw.value(c), kind in ("mul", "div")
    if c_val is None:
        if not scaled:
            return
        raise _NotFused(f"runtime scale: {c.name} is not a stored constant (a runtime input, or computed: its values "
                        f"are known only once evaluated)")
    rw.require_not_skipped(node)
    w_op = _fusible(rw, op, batch_norm=False)
    _channel_check(c, node, w_op)
    _movable(op, node)
    dtype = compute_dtype(val(w_op.weight).dtype, *((val(c).dtype,) if isinstance(c, torch.fx.Node) else ()))
    b_dtype = val(w_op.bias if w_op.bias is not None else w_op.weight).dtype
    cvec = c_val.double().reshape(-1).expand(w_op.channels)
    b_old = rw.value(w_op.bias)
    b_new = binary_bias(Eager(), b_old, kind, cvec.to(dtype), dtype)
    f = (cvec if kind == "mul" else 1 / cvec) if scaled else None
    if scaled:
        _products(rw, w_op, f, b_new, b_old, str(getattr(c, "name", c)))
    elif not bool(cvec.isfinite().all()) or not bool((b_new.double().abs() <= torch.finfo(b_dtype).max).all()):
        raise _NotFused(f"{getattr(c, 'name', c)} holds inf or NaN, or its sum with {op.name}'s bias overflows "
                        f"{b_dtype}: folded into the bias it would give other values than the runtime op")
    _rewrite(rw, node, node, [node], w_op, kind, f, b_new, [], lambda m: _channel_vector(m, c, w_op, dtype),
             lambda m, c_n: (c_n, binary_bias(m, w_op.bias, kind, c_n, dtype)), dtype, kind)


def _known_weight(rw: _Rewrite, op: Any) -> bool:
    w_op = weight_op(op)
    return w_op is not None and (w_op.weight in rw.amax or rw.value(w_op.weight) is not None)


def _fusible(rw: _Rewrite, x: Any, batch_norm: bool) -> WeightOp:
    """`x` as a `WeightOp` that can take a batch norm (or a binary op), else `_NotFused`."""
    w_op = weight_op(x)
    if w_op is None:
        what = op_name(x.target) if getattr(x, "op", None) == "call_function" else getattr(x, "op", type(x).__name__)
        raise _NotFused(f"reads {getattr(x, 'name', x)} ({what}), not a conv or linear")
    if len(x.users) != 1:
        raise _NotFused(f"{x.name}'s output is also read by {', '.join(u.name for u in list(x.users)[:4])}")
    if batch_norm and w_op.channel_axis != 1:
        raise _NotFused(f"{x.name}'s output channels are its dim {w_op.channel_axis} (a linear of a rank-"
                        f"{val(x).dim()} input or an unbatched conv), the batch norm's are dim 1")
    rw.require_not_skipped(x)
    if w_op.weight not in rw.amax:
        rw.require(w_op.weight, f"{x.name}'s weight")
    rw.require(w_op.bias, f"{x.name}'s bias")
    w_val, cap = val(w_op.weight), rw.policy.max_tensor_bytes
    if w_val.dtype not in FLOATS or val(x).dtype != w_val.dtype:
        raise _NotFused(f"{x.name}'s weight is {w_val.dtype}")
    if cap is not None and nbytes(w_val) > cap:
        raise _NotFused(f"{x.name}'s weight ({nbytes(w_val)} bytes) is above FoldPolicy.max_tensor_bytes")
    return w_op


def _movable(op: torch.fx.Node, reader: torch.fx.Node) -> None:
    """`_NotFused` unless the weight op `op` may move down to just before `reader`: no node
    between them writes in place (``y = linear(buf); buf.add_(x); y * 2``) or has side effects."""
    n = op.next
    while n is not reader and n.op != "output":
        if n.op != "call_function" or written_arg_positions(n) \
                or op_facts(n.target).kind in (OpKind.EFFECTFUL, OpKind.ASSERTION, OpKind.CONTROL_FLOW):
            what = op_name(n.target) if n.op == "call_function" else n.op
            raise _NotFused(f"{n.name} ({what}) writes in place or has side effects between {op.name} and {reader.name}")
        n = n.next


def _products(rw: _Rewrite, w_op: WeightOp, f: torch.Tensor, b_new, b_old, what: str) -> None:
    """`_NotFused` unless scaling `w_op`'s weight by `f` (float64, per channel) and making its
    bias `b_new` (``b_old * f`` for a scale) keeps eager's values (module docstring)."""
    name, dtype = w_op.node.name, val(w_op.weight).dtype
    fi = torch.finfo(dtype)
    if not bool(f.isfinite().all()) or bool((f == 0).any()):
        raise _NotFused(f"{what} holds 0, inf or NaN: folded into the weight it would lose the signed zeros, "
                        f"infinities or NaNs the runtime op gives")
    if w_op.weight not in rw.amax:
        rw.amax[w_op.weight] = w_op.per_channel(rw.value(w_op.weight),
                                                lambda t, d: torch.maximum(t.amax(d), t.amin(d).neg())).double()
    amax, b64 = rw.amax[w_op.weight], b_new.double().abs() if b_new is not None else torch.zeros(())
    if not bool(amax.isfinite().all()) or (b_old is not None and not bool(b_old.isfinite().all())):
        raise _NotFused(f"{name}'s weight or bias holds inf or NaN")
    w = amax * f.abs()
    big = max(w.max().item(), b64.max().item())
    if not big <= fi.max:
        raise _NotFused(f"{what} times {name}'s weight or bias reaches {big:.3g}, beyond {dtype}'s largest value "
                        f"{fi.max:.3g}: stored, it overflows to inf")
    if bool(((amax > 0) & (w < fi.tiny)).any()) or (b_old is not None and bool(((b_old != 0) & (b64 < fi.tiny)).any())):
        raise _NotFused(f"{what} shrinks a channel of {name}'s weight or bias below {dtype}'s smallest normal value: "
                        f"rounded, it would lose more than the runtime op's rounding")
    grows = f.abs() > 1
    if bool(grows.any()) and dtype in _LOW:
        raise _NotFused(f"in {dtype} {what} reaches {f.abs().max().item():.3g} (above 1): {name}'s partial sums would "
                        f"hold the scaled output's range and can overflow where the unfused op's do not")
    if bool((grows & (val(w_op.weight).numel() // w_op.channels * w + b64 >= math.sqrt(fi.max))).any()):
        raise _NotFused(f"{what} brings {name}'s partial sums within reach of {dtype}'s largest value: they could "
                        f"overflow where the unfused op's do not")


def _channel_check(c: Any, node: torch.fx.Node, w_op: WeightOp) -> None:
    """`_NotFused` when `c` does not broadcast along `w_op`'s output channels only, or would
    change the result's dtype or shape (Inductor's ``_check_conv_and_broadcast_op``)."""
    if not isinstance(c, torch.fx.Node):
        return
    c_val, out_val, op_val, axis = val(c), val(node), val(w_op.node), w_op.channel_axis
    if not isinstance(c_val, torch.Tensor) or c_val.dtype not in FLOATS + (torch.int32, torch.int64) \
            or tuple(out_val.shape) != tuple(op_val.shape) or out_val.dtype != op_val.dtype \
            or (c_val.dim() > 0 and c_val.dtype != op_val.dtype):
        raise _NotFused(f"{c.name} changes {w_op.node.name}'s shape or dtype")
    padded = [1] * (op_val.dim() - c_val.dim()) + list(c_val.shape)
    if c_val.dim() > op_val.dim() or any(d != 1 for i, d in enumerate(padded) if i != axis) \
            or padded[axis] not in (1, w_op.channels):
        raise _NotFused(f"{c.name} of shape {list(c_val.shape)} does not broadcast per output channel "
                        f"(dim {axis}) of {w_op.node.name}")


def _channel_vector(m: NodeMaker, c: Any, w_op: WeightOp, dtype: torch.dtype) -> torch.fx.Node:
    """`c` (checked: `_channel_check`) as a constant node of shape [channels] in `dtype`."""
    if not isinstance(c, torch.fx.Node):
        return m.op("full", [w_op.channels], float(c), dtype=dtype, device=torch.device("cpu"))
    flat = m.op("view", m.cast(c, dtype), [-1])
    return m.op("expand", flat, [w_op.channels]) if val(flat).shape[0] != w_op.channels else flat


def _rewrite(rw: _Rewrite, reader, out, removed: list, w_op: WeightOp, kind: str, f, b_new, freed: list,
             vector, operands, dtype: torch.dtype, label: str) -> None:
    """Within the growth budget, `w_op` reads ``W <kind> vector`` (when `f`, the factor, is
    not None) and the bias `operands` makes, both built before it (`vector(m)`, then
    ``operands(m, vector) -> (scale, bias)``); the readers of `out` read it, `removed` leave."""
    b_dtype = val(w_op.bias if w_op.bias is not None else w_op.weight).dtype
    added = (aligned(nbytes(val(w_op.weight))) if f is not None else 0) \
        + (aligned(w_op.channels * b_dtype.itemsize) if b_new is not None else 0)
    if not rw.fits(added, ([(w_op.weight, w_op.node)] if f is not None else []) + [(w_op.bias, w_op.node)] + freed):
        raise _NotFused(f"storing {w_op.node.name}'s new weight and bias exceeds the growth budget (its weight or "
                        f"bias is shared)")
    reader.prepend(w_op.node)  # after every constant the reader reads (only it reads the op: `_fusible`)
    m, name = rw.make, w_op.node.name
    with rw.graph.inserting_before(w_op.node):
        scale, bias = operands(m, vector(m))
        weight = scaled_weight(m, w_op, kind, scale, dtype, f"{name}_{label}_weight") if f is not None else w_op.weight
        bias = m.named(m.cast(bias, b_dtype), f"{name}_{label}_bias") if bias is not None else None
    fused = rw.make.with_operands(w_op, weight, bias)
    if f is not None:
        rw.amax[weight] = rw.amax[w_op.weight] * f.abs()
    if bias is not None:
        rw.values[bias] = b_new.to(b_dtype)
    rw.notes.append(f"{removed[0].name} ({op_name(removed[0].target)}) folded into the weight and bias of {fused.name}")
    rw.replace(out, fused, removed, Reason.FUSED, f"into {fused.name}")


def _scale_and_shift(rw: _Rewrite, bn, out, x, stats, known, dtype, why_not: str) -> None:
    """Formula 3 for the batch norm `bn` of `x` (not fused: `why_not`), else `_NotFused`."""
    x_dtype, channels = val(x).dtype, val(x).shape[1]
    centre, s, t = scale_and_shift(Eager(), x_dtype, known, dtype)
    exact = lambda v: v is None or bool((v.to(x_dtype).to(v.dtype) == v).all())  # noqa: E731
    refusal = None
    if centre is not None and not (exact(known[2]) and exact(known[1])):
        refusal = (f"its {known[2].dtype} running mean or bias is not exact in {x_dtype}: the runtime ops would round "
                   f"it first, where eager's batch norm computes in {dtype} and rounds once")
    elif not bool(s.isfinite().all()) or (t is not None and not bool(t.isfinite().all())):
        refusal = f"its scale or shift overflows {x_dtype}"
    elif centre is not None and bool(((s != 0) & (s.abs() < torch.finfo(x_dtype).tiny)).any()):
        refusal = f"its scale falls below {x_dtype}'s smallest normal value"
    elif not rw.fits((3 if centre is not None else 2) * aligned(channels * x_dtype.itemsize),
                     [(v, bn) for v in stats[:4]]):
        refusal = "storing its scale and shift exceeds the growth budget"
    if refusal is not None:
        raise _NotFused(f"not fused ({why_not}), and {refusal}")
    m, shape = rw.make, [channels] + [1] * (val(x).dim() - 2)
    view = lambda v, name: m.named(m.op("view", v, shape), f"{bn.name}_{name}")  # noqa: E731
    with rw.graph.inserting_before(bn):
        centre, s, t = scale_and_shift(m, x_dtype, stats, dtype)
        y = m.node(m.ops["sub"], (x, view(centre, "centre")), {}, f"{bn.name}_centred", bn) if centre is not None else x
        y = m.node(m.ops["mul"], (y, view(s, "scale")), {}, f"{bn.name}_scaled", bn)
        y = m.node(m.ops["add"], (y, view(t, "shift")), {}, f"{bn.name}_shifted", bn) if t is not None else y
    rw.notes.append(f"{bn.name} ({op_name(bn.target)}) rewritten as a per-channel multiply and add "
                    f"({y.name}; not fused into a weight: {why_not})")
    rw.replace(out, y, list(dict.fromkeys((bn, out))), Reason.SCALE_AND_SHIFT, why_not)
