"""Batch norms and constant scales and shifts folded into the weight and bias of the conv or
linear before them (issue 54).

An eval-mode batch norm is ``y * s + t`` per channel (dim 1) with ``s = gamma * rsqrt(var + eps)``
and ``t = beta - mean * s``, all constant. This rewrite of the working program (a preparation
step, like `transposed_gathers`) replaces, in the program's own dialect (ATen or Edge):

1. ``bn(op(x, W, b))`` -> ``op(x, W', b')`` with ``W' = W * s`` along the op's output-channel
   axis (dim 1 of a batched conv's output, dim 0 of an unbatched one's, the last of a linear's:
   only dim 1 is a batch norm's) and ``b' = (b - mean) * rsqrt(var + eps) * gamma + beta`` (the node's own ``eps``; the
   same order of operations as torch.nn.utils.fusion.fuse_conv_bn_weights, so equal values;
   not always the same bits: without a bias or beta it computes ``neg(mean)`` and adds no
   zeros, so a zero mean gives -0.0 where torch gives +0.0), where
   ``op`` is a conv (1d/2d/3d, grouped, depthwise, with or without bias), a transposed conv
   (output channels on dim 1 of its weight, per group), a ``linear``, or Edge's ``addmm``/``mm``
   of a decomposed ``linear`` (output channels on dim 1 of the matrix it reads);
2. a batch norm with nothing to fuse into -> ``y * s_view + t_view`` (``aten.mul`` and
   ``aten.add`` by constants shaped ``[C, 1, ...]``; in fp16 and bf16 ``(y - mean_view) *
   s_view + beta_view``, which does not cancel: "Rounding" below): what every backend computes
   right, where QNN's BatchNorm builder ignores ``eps`` (executorch 1.5.1
   backends/qualcomm/builders/op_batch_norm.py);
3. ``op(x) * c``, ``/ c``, ``+ c``, ``- c`` with ``c`` a constant scalar or a tensor that
   broadcasts along the output-channel axis only -> the op with ``W * c`` / ``W / c`` and
   ``b * c``, ``b / c``, ``b + c``, ``b - c`` (a bias is added where there was none), as
   Inductor's torch/_inductor/fx_passes/binary_folding.py does.

``W'`` and ``b'`` are constant-only nodes the fold then evaluates and stores as lifted constants
with its own machinery (names, dedup, size limits, growth budget, report); the old weight and
the batch norm's vectors lose their readers and leave the program. Values in fp16/bf16 are
computed in fp32 and cast back.

Constant here means: a parameter, buffer or lifted constant whose value is the same at every
call (neither written back by the signature nor written in place by an op of the graph, such as
training IR's ``running_mean.copy_(...)`` or ``weight.mul_(...)``, nor read by a custom op:
`unchanging.unchanging_before_probes`), a Python number, or a pure op of constants (Edge's
``permute_copy`` of a ``linear`` weight, a cast of a lifted scalar); never through a
dequantize. Not rewritten, each with a `Reason.NOT_FUSED` row saying why: training-mode batch
norm; runtime weights, statistics or scales; quantized operands (a dequantize read as weight,
statistic, scale or input, or a batch norm whose output is quantized: the rewrite would need an
encoding the quantizer never chose); a symbolic channel count; a ``c`` that does not broadcast
per output channel; a weight op whose output other ops read too (then 2. for a batch norm); a
node between the weight op and the batch norm or binary op that writes in place or has side
effects (the rewrite moves the weight op down to it; then 2.); ``* c`` or ``/ c`` by a
computed tensor (its values are not known before evaluation) or one holding inf or NaN (or 0
for ``/``): ``W / 0`` gives NaN where ``(W x) / 0`` gives ±inf; batch-norm statistics that are
computed, hold inf or NaN, or have ``var + eps <= 0`` (the batch norm stays); a
copy of a weight another op also reads beyond the growth budget, or a weight above
``max_tensor_bytes`` (then 2.); ops the policy skips; a fused weight or bias, or a scale or
shift of 2., beyond its dtype's largest value (stored, it would be inf where the runtime ops'
results are finite: decided on the stored values, `_StoredValues`; in fp16 and bf16 a
computed weight, bias or constant, whose range cannot be known, is refused too); in fp16 and
bf16, a fused bias that would cancel most of the output ("Rounding"; then 2.), or a scale above 1
(the weight op's partial sums, some kept in fp16 by ATen's CPU kernels, would hold the scaled
output's range and could overflow where the unfused op's do not: `_grows`; then 2.).
``FoldPolicy(fuse_into_weights=False)`` turns the rewrite off. After a ``cond`` is inlined the
rewrite runs again on what its taken body brought (`working.Preparation`).

Rounding in fp16 and bf16 (u = 2^-11, 2^-8; eager's kernels compute in fp32 and round the
result once). Eager computes ``y = conv(x)``, rounds it (error ``u |y|``), then the batch norm
``(y - mean) * s + beta`` in fp32, rounded once: its error is about ``u (|s| |y| + |out|)``.
The fused conv rounds ``W' = W * s`` (error ``u |s| |x W|`` summed over the fan-in, as in fp32)
and ``b' = (b - mean) * s + beta`` (error ``u |b'|``), then accumulates in fp32 and rounds once
(``u |out|``). The term eager lacks is ``u |b'|``: in a quiet channel (``|mean| >> sqrt(var +
eps)``) ``b'`` cancels most of ``W' x`` and ``|b'| ~ |mean * s|`` is thousands of times the
output. Eager loses as much where ``y`` is not an exact fp16 value (``u |s| |y|``, ``y ~ mean``:
measured on 3x3 convs of 1 to 64 random input channels, quiet channels mean 50 / var 1e-4,
fused and eager within 1.5x of each other), but nothing where it is (an identity conv, constant
inputs: 2.4 off at an output scale of 8.9 fused, 0.002 eager). So a batch norm is not fused in
fp16/bf16 when some channel has ``|b'| > 8 (|beta| + |gamma|)`` (`CANCELLATION_RATIO`; the
output's size is about ``|beta| + |gamma| z`` with ``|z|`` a few: that is the channel's mean
more than ~8 of its own standard deviations from the conv's bias); the fused error is then at
most eager's plus ``u (8 (|beta| + |gamma|) + |out|)`` and the ``W'`` term. A conv whose bias
holds the mean (``b ~ mean``) fuses, and ``b - mean`` cancels exactly in fp32: measured 400x
more accurate than eager. ``x * s + t`` as two runtime ops cancels the same way (4.0 off where
eager is 0.0018); ``(x - mean) * s + beta`` does not (``x - mean`` is exact for ``x`` near
``mean``), and is within 1-4x of eager (three roundings in fp16 where eager's kernel rounds
once). fp32 programs (what QNN's flows export, HTP computing in fp16) keep ``x * s + t`` and
the fusion: their bound is tests/fusion_bounds.py's.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from .dedup import placeholder_savings
from .dialect import dialect_op
from .hops import copy_uncompiled
from .names import reserve_node_names, with_renamed_outputs
from .ops import OpKind, arg_at, op_facts, op_name, written_arg_positions
from .policy import FoldPolicy
from .quant import is_dequantize, is_quantize
from .reasons import Reason
from .report import Decision
from .sizes import aligned, nbytes, stored_tensor
from .torch_internals import program_with
from .unchanging import unchanging_before_probes
from .weight_ops import (BATCH_NORMS, BINARY, CONVS, FLOATS, INSERTED, LINEARS, TRAINING_BATCH_NORMS, DialectOps,
                         NodeMaker, WeightOp, batch_norm_operands, batch_norm_output, binary_operands,
                         channel_magnitudes, compute_dtype, scale_and_shift, val,
                         weight_op)


@dataclass(frozen=True)
class FusionRows:
    """The rewrite's part of the report (`report_builder.with_rule_decisions`).

    Attributes:
        decisions: a `Decision` per batch norm (and its getitem) or binary op rewritten
            (`Reason.FUSED`, `Reason.SCALE_AND_SHIFT`) or left as it is (`Reason.NOT_FUSED`),
            named as in the program being folded; each replaces the fold's decision for that
            name.
        inserted: names of the nodes the rewrite inserted: the fold's decisions for them are
            dropped (folded, or the runtime multiply and add standing for a batch norm)
            unless one was kept although constant-only (invariant 3).
    """

    decisions: tuple[Decision, ...] = ()
    inserted: frozenset = frozenset()


@dataclass(frozen=True)
class Fusion:
    """What `fuse_into_weights` did.

    Attributes:
        program: the rewritten copy, or the program itself when nothing was rewritten.
        notes: one line per rewrite, for the report (`FoldReport.rewrites`).
        rows: its report rows (`FusionRows`).
        replaced: ``(old, new)`` node names: the value of `old` (a batch norm's output, a
            binary op) is now computed by `new` (the weight op, or the batch norm's add), in
            rewrite order (for differential checks of the rewrite alone).
    """

    program: ExportedProgram
    notes: tuple[str, ...] = ()
    rows: FusionRows = FusionRows()
    replaced: tuple[tuple[str, str], ...] = ()


def fuse_into_weights(program: ExportedProgram, policy: FoldPolicy, bytes_before: int, spent: int = 0) -> Fusion:
    """Fold eval-mode batch norms and constant scales and shifts into the weight and bias of the
    conv or linear before them, or rewrite a batch norm as a per-channel multiply and add
    (module docstring).

    Args:
        program: the program being folded (ATen or Edge dialect); never modified.
        policy: ``fuse_into_weights`` turns the rewrite off; ``skip_targets``,
            ``max_tensor_bytes`` and the growth budget decide as for any folded value.
        bytes_before: the constant bytes the caller's program stores (for the growth budget), in bytes.
        spent: bytes of the growth budget earlier rounds spent (`program` stores
            ``bytes_before + spent``; a negative `spent`, bytes they saved, spends none).

    Returns:
        A `Fusion`: a copy of `program` (top-level graph copied; tensors, bodies shared) that
        the attempt then owns, or `program` itself when nothing was rewritten. Without a
        candidate (a batch norm, or a conv or linear) it reads only fx's per-target node index;
        with one, a few passes over the nodes (the unchanging stored inputs, the copy, names,
        placeholder savings, the inserted names) and, per candidate, the
        nodes between its weight op and it and the ancestry of the constants it drops.
    """
    if not policy.fuse_into_weights:
        return Fusion(program)
    if not _targets_present(program):
        return Fusion(program)
    unchanging = unchanging_before_probes(program)  # once: a pass over every node
    candidates = _candidates(program, _Constness(unchanging))
    if not candidates:
        return Fusion(program)
    gm, env = copy_uncompiled(program.graph_module)
    reserve_node_names(gm)
    maker = NodeMaker(gm.graph, DialectOps.of(program))
    savings = placeholder_savings(gm.graph, program)
    values = lambda spec: stored_tensor(spec, program.state_dict, program.constants)  # noqa: E731
    rewriter = _Rewriter(maker, _Conditions(_Constness(unchanging, maker.made), policy, bytes_before, savings, values,
                                               max(spent, 0)))
    for node in candidates:
        rewriter.visit(env[node])
    if not rewriter.changed:
        return Fusion(program, (), FusionRows(tuple(rewriter.decisions)))
    signature = with_renamed_outputs(program.graph_signature, rewriter.renamed)
    return Fusion(program_with(program, graph_module=gm, graph_signature=signature), tuple(rewriter.notes),
                  FusionRows(tuple(rewriter.decisions), maker.inserted_names()), tuple(rewriter.replaced))


def _targets_present(program: ExportedProgram) -> bool:
    """Whether `program` calls a conv, linear or batch norm (fx's per-target node index)."""
    names = tuple(CONVS) + tuple(LINEARS) + tuple(BATCH_NORMS) + tuple(TRAINING_BATCH_NORMS)
    return any(program.graph.find_nodes(op="call_function", target=t) for t in _targets(program, names))


def _candidates(program: ExportedProgram, constness: "_Constness") -> list[torch.fx.Node]:
    """The nodes the rewrite starts from: the batch norms and binary ops reading (or, once the
    rewrites before them are done, going to read) a conv or linear of a constant weight, chain
    by chain in order from each weight op; then every other batch norm. A binary op is one
    only when its other operand is constant or it is a ``mul``/``div`` (a residual sum is
    none). Found through fx's per-target node index, without a pass over the whole graph."""
    graph = program.graph
    found = lambda names: [n for t in _targets(program, names) for n in graph.find_nodes(op="call_function", target=t)]  # noqa: E731
    out: dict[torch.fx.Node, None] = {}
    for op in found(tuple(CONVS) + tuple(LINEARS)):
        w_op = weight_op(op)
        if w_op is None or constness(w_op.weight) is not None:
            continue
        todo = [op]
        while todo:
            n = todo.pop(0)
            for u in n.users:
                kind = _kind(u.target) if u.op == "call_function" else ""
                if kind == "getitem" and u.args[1] == 0 and n in out:
                    todo.append(u)
                elif kind == "bn" or (kind not in ("", "weight", "getitem") and len(u.args) >= 2 and _continues(u, n, kind, constness)):
                    out[u] = None
                    todo.append(u)
                elif n is op and _is_view(u):  # Edge's linear of a rank-3 input: only a row (`_binary`)
                    out.update((v, None) for v in u.users if v.op == "call_function" and _kind(v.target) not in
                               ("", "weight", "getitem", "bn") and len(v.args) >= 2 and _continues(v, u, _kind(v.target), constness))
    for bn in found(tuple(BATCH_NORMS) + tuple(TRAINING_BATCH_NORMS)):
        out.setdefault(bn, None)
    return list(out)


_VIEWS = frozenset({"aten.view.default", "aten.view_copy.default", "aten._unsafe_view.default", "aten.reshape.default"})


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and op_name(node.target) in _VIEWS


def _require_no_view_between(node: torch.fx.Node) -> None:
    """`_NotFused` when the binary op `node` reads a weight op through a view (Edge's linear of
    a rank-3 input: view_copy -> addmm -> view_copy): not fused, with its row."""
    for a in node.args[:2]:
        if isinstance(a, torch.fx.Node) and _is_view(a) and weight_op(a.args[0]) is not None:
            raise _NotFused(f"reads {a.args[0].name} through {a.name} (a linear of a rank-3 input, "
                            f"view -> addmm -> view): not fused")


def _continues(node: torch.fx.Node, chain: torch.fx.Node, kind: str, constness: "_Constness") -> bool:
    """Whether the binary op `node` scales or shifts `chain` by a constant (or scales it at all)."""
    a, b = node.args[0], node.args[1]
    others = [b] if a is chain else [a] if b is chain and kind in ("mul", "add") else []
    return bool(others) and (kind in ("mul", "div") or constness(others[0]) is None)


def _targets(program: ExportedProgram, names: tuple) -> list:
    """The call targets of `names` (``aten.conv2d.default`` …) in the program's dialect."""
    return [t for t in (dialect_op(program, name) for name in names) if t is not None]


def _kind(target) -> str:
    """What the candidate search sees in a call target: a batch norm, a weight op, a getitem, a
    binary op's kind, or nothing (empty)."""
    if target is operator.getitem:
        return "getitem"
    name = op_name(target)
    if name in BATCH_NORMS or name in TRAINING_BATCH_NORMS:
        return "bn"
    if name in CONVS or name in LINEARS:
        return "weight"
    return BINARY.get(name, "")


def _operands(node: torch.fx.Node, kind: str, constness: "_Constness") -> tuple:
    """(weight op, other operand) of a binary op that reads a conv or linear of a constant
    weight (either side of a ``mul`` or ``add``; the left of a ``div`` or ``sub``), else
    (None, None)."""
    if len(node.args) < 2:
        return None, None
    a, b = node.args[0], node.args[1]
    for op, c in ((a, b), (b, a)) if kind in ("mul", "add") else ((a, b),):
        w_op = weight_op(op)
        if w_op is not None and constness(w_op.weight) is None:
            return op, c
    return None, None


class _Constness:
    """Whether a value is constant (module docstring): ``constness(node)`` is None when it is,
    else what it is (a row's detail). Memoised per node; nodes the rewrite inserts (`made`)
    are constant."""

    def __init__(self, stored: dict, made: Optional[set] = None) -> None:
        self.stored = stored
        self.made = made if made is not None else set()
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


class _NotFused(Exception):
    """Why a candidate is left as it is (the `Reason.NOT_FUSED` row's detail)."""


def _operand_detail(why: str) -> str:
    return "quantized operands" if why.startswith("quantized") else "runtime operand"


def _movable(op: torch.fx.Node, reader: torch.fx.Node) -> Optional[str]:
    """None when the weight op `op` may move down to just before `reader` (the batch norm or
    binary op, its only reader), else why not: a node strictly between them that writes
    in place (its input may be one of them: ``y = linear(buf); buf.add_(x); y * 2``) or has
    side effects would then run before it."""
    n = op.next
    while n is not reader and n.op != "output":
        if n.op != "call_function" or written_arg_positions(n) \
                or op_facts(n.target).kind in (OpKind.EFFECTFUL, OpKind.ASSERTION, OpKind.CONTROL_FLOW):
            what = op_name(n.target) if n.op == "call_function" else n.op
            return f"{n.name} ({what}) writes in place or has side effects between {op.name} and {reader.name}"
        n = n.next
    return None


class _StoredValues:
    """The values of a candidate's operands known at rewrite time (numbers and the tensors of
    placeholders the program never writes), and the checks that folding them gives what the
    runtime op gives."""

    def __init__(self, stored: dict, values) -> None:
        self.stored, self.values = stored, values

    def require_known_values(self, kind: str, c: Any, w_op: WeightOp) -> None:
        """`_NotFused` unless folding ``* c`` or ``/ c`` (`kind`) into `w_op`'s weight gives
        what the runtime op gives: `c` a number or a stored tensor (`stored_value`), finite,
        and nonzero for ``/``. ``W * inf`` or ``W / 0`` gives NaN where ``W x`` is 0 and ±inf
        where eager gives ±inf or NaN. ``+ c`` and ``- c`` fold as ``b + c`` whatever `c`
        holds. For every `kind`, the new weight and bias fit the dtype (`binary_refusal`)."""
        why_not = self.binary_refusal(kind, c, w_op)
        if why_not is not None:
            raise _NotFused(why_not)
        if kind not in ("mul", "div"):
            return
        value = self.value(c)
        if value is None:
            raise _NotFused(f"{getattr(c, 'name', c)} is computed: its values are not known before evaluation "
                            f"(0, inf or NaN would change the result)")
        bad = ~torch.isfinite(value) | (value == 0) if kind == "div" else ~torch.isfinite(value)
        if bool(bad.any()):
            raise _NotFused(f"{getattr(c, 'name', c)} holds {'0, ' if kind == 'div' else ''}inf or NaN: "
                            f"folded into the weight it would give NaN where the runtime op does not")

    def require_known_statistics(self, stats: tuple) -> None:
        """`_NotFused` unless a batch norm's gamma, beta, mean and var (`stats`, then eps) are
        stored tensors (or absent), finite, with ``var + eps > 0``: else eager's
        ``(x - mean) * rsqrt(var + eps)`` gives ±inf or NaN where ``W * s`` or ``x * s + t``
        gives others (``inf - inf``)."""
        *vectors, eps = stats
        for what, v in zip(("weight", "bias", "running mean", "running variance"), vectors):
            if v is None:
                continue
            value = self.value(v)
            if value is None:
                raise _NotFused(f"batch norm {what} {v.name} is computed: its values are not known before evaluation "
                                f"(inf, NaN or var + eps <= 0 would change the result)")
            if not bool(torch.isfinite(value).all()) or (what == "running variance"
                                                           and not bool((value.to(compute_dtype(value.dtype)) + eps > 0).all())):
                raise _NotFused(f"batch norm {what} {v.name} holds inf or NaN, or var + eps <= 0: "
                                f"rewritten it would give other non-finite values than the batch norm")

    def value(self, v: Any) -> Optional[torch.Tensor]:
        """The value of `v` known at rewrite time: a number, the tensor a placeholder the
        program never writes stores, or a layout op of one (Edge's ``permute_copy`` of a
        linear's weight: applied to the stored tensor); else None (a computed value)."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return torch.tensor(float(v), dtype=torch.float64)
        if isinstance(v, torch.fx.Node) and v.op == "placeholder" and v.name in self.stored:
            return self.values(self.stored[v.name])
        if isinstance(v, torch.fx.Node) and v.op == "call_function" and op_name(v.target) in _LAYOUT_OPS:
            inner = self.value(v.args[0])
            return None if inner is None else v.target(inner, *v.args[1:], **v.kwargs)
        return None

    def _weight_and_bias(self, w_op: WeightOp) -> Optional[tuple]:
        """(per-channel largest ``|W|``, bias or 0) of `w_op` in float64, or None when not known."""
        w = self.value(w_op.weight)
        b = self.value(w_op.bias) if w_op.bias is not None else torch.zeros((), dtype=torch.float64)
        if w is None or b is None:
            return None
        return channel_magnitudes(w_op, w), b.double()

    def batch_norm_refusal(self, w_op: WeightOp, stats: tuple) -> Optional[str]:
        """None when folding the batch norm of `stats` (known: `require_known_statistics`) into
        `w_op` gives a weight and bias that fit its dtype and, in fp16 and bf16, a bias whose
        rounding loses no more than eager's own (module docstring, "Rounding"); else why not."""
        dtype = val(w_op.weight).dtype
        known = self._weight_and_bias(w_op)
        if known is None:
            return None if dtype not in _LOW else (f"{w_op.node.name}'s weight or bias is computed: its {dtype} "
                                                   f"range cannot be checked before evaluation")
        w, b = known
        gamma, beta, mean, var = (torch.zeros((), dtype=torch.float64) + (1.0 if i == 0 else 0.0) if v is None
                                  else self.value(v).double() for i, v in enumerate(stats[:4]))
        s = gamma / (var + stats[4]).sqrt()
        folded = (b - mean) * s + beta
        why = (_overflow(dtype, ((w * s.abs(), f"{w_op.node.name}'s weight * s"), (folded, "its bias (b - mean) * s + beta")))
               or _grows(dtype, s, "the batch norm's scale gamma / sqrt(var + eps)", w_op))
        if why is not None or dtype not in _LOW:
            return why
        size = beta.abs() + gamma.abs()  # the output's size: beta + gamma * (a few)
        worst = (folded.abs() / size.clamp_min(torch.finfo(torch.float64).tiny)).max().item()
        if worst > CANCELLATION_RATIO:
            return (f"in {dtype} its folded bias would cancel most of {w_op.node.name}'s output: |b'| is {worst:.3g} x "
                    f"the channel's |beta| + |gamma| (above {CANCELLATION_RATIO:g}); rounded in {dtype} it could lose "
                    f"more than the batch norm's own rounding")
        return None

    def scale_and_shift_refusal(self, dtype: torch.dtype, stats: tuple) -> Optional[str]:
        """None when the scale ``s`` (and, in fp32 and fp64, the shift ``beta - mean * s``) of
        `stats` (known) fit `dtype`; else why not."""
        gamma, beta, mean, var = (None if v is None else self.value(v).double() for v in stats[:4])
        s = (1.0 if gamma is None else gamma) / (var + stats[4]).sqrt()
        values = [(s, "its scale gamma / sqrt(var + eps)")]
        if dtype not in _LOW:
            values.append(((0.0 if beta is None else beta) - mean * s, "its shift beta - mean * s"))
        return _overflow(dtype, values)

    def binary_refusal(self, kind: str, c: Any, w_op: WeightOp) -> Optional[str]:
        """None when folding ``* c``, ``/ c``, ``+ c`` or ``- c`` (`kind`; `c` checked per
        channel) into `w_op` gives a weight and bias that fit its dtype; else why not."""
        dtype = val(w_op.weight).dtype
        known, value = self._weight_and_bias(w_op), self.value(c)
        if known is None or value is None:
            return None if dtype not in _LOW else (f"{w_op.node.name}'s weight or bias, or {getattr(c, 'name', c)}, "
                                                   f"is computed: its {dtype} range cannot be checked before evaluation")
        w, b = known
        c = value.double().reshape(-1)
        if kind == "mul":
            values = ((w * c.abs(), "its weight * c"), (b * c, "its bias * c"))
        elif kind == "div":
            values = ((w / c.abs(), "its weight / c"), (b / c, "its bias / c"))
        else:
            values = (((b + c) if kind == "add" else (b - c), f"its bias {'+' if kind == 'add' else '-'} c"),)
        return _overflow(dtype, values) or (kind in ("mul", "div") and _grows(dtype, c if kind == "mul" else 1.0 / c, f"the factor of {kind}", w_op)) or None


# Layout ops `_StoredValues.value` looks through (they move values, never change them).
_LAYOUT_OPS = frozenset({"aten.permute.default", "aten.permute_copy.default", "aten.t.default", "aten.t_copy.default",
                         "aten.transpose.int", "aten.transpose_copy.int", "aten.view.default",
                         "aten.view_copy.default", "aten.reshape.default", "aten._unsafe_view.default",
                         "aten.clone.default", "aten.alias.default", "aten.alias_copy.default"})
_LOW = (torch.float16, torch.bfloat16)
# Module docstring, "Rounding": an fp16/bf16 fused bias may be this many times the channel's
# |beta| + |gamma| (the size of its output) before its rounding may outweigh eager's.
CANCELLATION_RATIO = 8.0


def _grows(dtype: torch.dtype, factor: torch.Tensor, what: str, w_op: WeightOp) -> Optional[str]:
    """Why scaling `w_op`'s weight by `factor` (float64, per channel) is refused in fp16 and
    bf16 when some ``|factor| > 1``, else None. The weight op's partial sums then hold the
    scaled output's range, and ATen's CPU kernels keep some in the low precision
    (``conv_transpose2d``'s col2im adds overlapping patches in fp16): they overflow to inf
    where the unfused op's smaller sums do not and only the final scale, computed in fp32 and
    rounded once, reaches the output's range (fuzz seed 3027009106: ``conv_transpose2d(x, W) /
    1e-4``, 54,912 in eager, inf fused). A factor of at most 1 shrinks every partial sum."""
    if dtype not in _LOW:
        return None
    big = factor.abs().masked_fill(~torch.isfinite(factor), 0.0)
    if big.numel() and big.max().item() > 1.0:
        return (f"in {dtype} {what} reaches {big.max().item():.3g} (above 1): {w_op.node.name}'s partial sums would "
                f"hold the scaled output's range and can overflow where the unfused op's do not")
    return None


def _overflow(dtype: torch.dtype, values) -> Optional[str]:
    """Why the first of `values` ((float64 tensor, what)) holding a finite value beyond
    `dtype`'s range overflows it, or None (each is stored in `dtype`: beyond it, inf)."""
    limit = torch.finfo(dtype).max
    for value, what in values:
        big = value.abs().masked_fill(~torch.isfinite(value), 0.0)
        if big.numel() and big.max().item() > limit:
            return f"{what} reaches {big.max().item():.3g}, beyond {dtype}'s largest value {limit:.3g}: stored, it overflows to inf"
    return None


class _Conditions:
    """When a candidate may be rewritten (module docstring); each check raises `_NotFused` or
    returns why not, for the report. Keeps the growth of stored bytes the rewrites spent.

    Attributes:
        savings: what dropping each constant placeholder saves (`dedup.placeholder_savings`).
        values: the tensor a stored placeholder's InputSpec names (`sizes.stored_tensor`).
    """

    def __init__(self, constness: _Constness, policy: FoldPolicy, bytes_before: int, savings: dict,
                 values=lambda spec: None, spent: int = 0) -> None:
        self.constness, self.policy, self.savings = constness, policy, savings
        self.known = _StoredValues(constness.stored, values)
        self.budget, self.spent = policy.growth_budget(bytes_before), spent
        self.skip = policy.skip_names()
        self.skipped = sorted(INSERTED & self.skip)

    def require_constant(self, node: Any, what: str) -> None:
        why = self.constness(node)
        if why is not None:
            raise _NotFused(f"{_operand_detail(why)}: {what} {getattr(node, 'name', node)} is {why}")

    def require_not_skipped(self, node: torch.fx.Node) -> None:
        name = op_name(node.target)
        if self.skipped or name in self.skip or name.rsplit(".", 1)[0] in self.skip:
            raise _NotFused(f"FoldPolicy.skip_targets holds {', '.join(self.skipped or [name])}")

    def require_scale_and_shift(self, bn: torch.fx.Node, x: torch.fx.Node, stats: tuple, why_not: str) -> None:
        """`_NotFused` unless the batch norm `bn` of `x` (not fused: `why_not`) may become
        ``(x - centre) * s + t``: its constants fit `x`'s dtype and the growth budget (spent
        when they do)."""
        x_val = val(x)
        refusal = self.known.scale_and_shift_refusal(x_val.dtype, stats)
        if refusal is not None:
            raise _NotFused(f"not fused ({why_not}), and {refusal}")
        saved = sum(self.saved(bn, v) for v in stats[:4])
        vectors = 3 if x_val.dtype in _LOW else 2  # (x - mean) * s + beta; x * s + t
        if not self.fits(vectors * self.stored_bytes(None, x, x_val.shape[1]) - saved):
            raise _NotFused(f"not fused ({why_not}), and storing its scale and shift exceeds the growth budget")

    def fusible(self, x: Any, batch_norm: bool) -> Optional[str]:
        """None when the weight op `x` can take a batch norm (or a binary op) into its weight
        and bias, else why not."""
        w_op = weight_op(x)
        if w_op is None:
            what = op_name(x.target) if getattr(x, "op", None) == "call_function" else getattr(x, "op", type(x).__name__)
            return f"reads {getattr(x, 'name', x)} ({what}), not a conv or linear"
        if len(x.users) != 1:
            return f"{x.name}'s output is also read by {', '.join(u.name for u in list(x.users)[:4])}"
        if batch_norm and w_op.channel_axis != 1:
            return (f"{x.name}'s output channels are its dim {w_op.channel_axis} (a linear of a rank-{val(x).dim()} "
                    f"input or an unbatched conv), the batch norm's are dim 1")
        try:
            self.require_not_skipped(x)
        except _NotFused as why:
            return str(why)
        for role, v in (("weight", w_op.weight), ("bias", w_op.bias)):
            why = self.constness(v)
            if why is not None:
                return f"{_operand_detail(why)}: {x.name}'s {role} {v.name} is {why}"
        w_val = val(w_op.weight)
        if w_val.dtype not in FLOATS or val(x).dtype != w_val.dtype:
            return f"{x.name}'s weight is {w_val.dtype}"
        cap = self.policy.max_tensor_bytes
        if cap is not None and nbytes(w_val) > cap:
            return f"{x.name}'s weight ({nbytes(w_val)} bytes) is above FoldPolicy.max_tensor_bytes"
        return None

    def fits(self, growth: int) -> bool:
        """Whether the program may grow by `growth` more stored bytes (the growth budget);
        spends them when it may."""
        if self.budget is not None and self.spent + growth > self.budget:
            return False
        self.spent += growth
        return True

    def rewrite_fits(self, w_op: WeightOp, scaled: bool, new_bias: bool, reader=None, dropped=()) -> bool:
        """Whether `w_op` reading a new weight (when `scaled`) and a new bias (`new_bias`), while
        `reader` stops reading `dropped`, fits the growth budget, counted as the planner
        counts it (`dedup.placeholder_savings`: a placeholder another op still reads, or
        whose bytes another stored tensor repeats, saves nothing)."""
        bias_like = w_op.bias if w_op.bias is not None else w_op.weight
        added = (self.stored_bytes(w_op.weight, w_op.weight) if scaled else 0) \
            + (self.stored_bytes(w_op.bias, bias_like, w_op.channels) if new_bias else 0)
        saved = sum(self.saved(w_op.node, v) for v in ([w_op.weight] if scaled else []) + [w_op.bias])
        return self.fits(added - saved - sum(self.saved(reader, v) for v in dropped))

    def saved(self, reader: torch.fx.Node, v: Any) -> int:
        if not isinstance(v, torch.fx.Node) or v in self.constness.made:
            return 0
        ancestry, todo = set(), [v]
        while todo:
            n = todo.pop()
            if n not in ancestry:
                ancestry.add(n)
                todo.extend(n.all_input_nodes)
        if any(u is not reader and u not in ancestry for a in ancestry for u in a.users):
            return 0  # another op reads it: it stays
        return sum(self.savings.get(a, 0) for a in ancestry)

    def stored_bytes(self, v: Any, like: torch.fx.Node, numel: Optional[int] = None) -> int:
        """Bytes a new value replacing `v` stores (none when `v` is one the rewrite made: it
        replaces it), shaped like `like` or of `numel` elements of its dtype."""
        if v is not None and v in self.constness.made:
            return 0
        value = val(like)
        return aligned((numel if numel is not None else value.numel()) * value.element_size())


def _channel_check(c: Any, node: torch.fx.Node, w_op: WeightOp) -> None:
    """`_NotFused` when `c` does not broadcast along `w_op`'s output channels only, or
    would change the result's dtype or shape."""
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return
    c_val, out_val, op_val, channels = val(c), val(node), val(w_op.node), w_op.channels
    if not isinstance(c_val, torch.Tensor) or c_val.dtype not in FLOATS + (torch.int32, torch.int64) \
            or tuple(out_val.shape) != tuple(op_val.shape) or out_val.dtype != op_val.dtype \
            or (c_val.dim() > 0 and c_val.dtype != op_val.dtype):
        raise _NotFused(f"{getattr(c, 'name', c)} changes {w_op.node.name}'s shape or dtype")
    axis = w_op.channel_axis
    padded = [1] * (op_val.dim() - c_val.dim()) + list(c_val.shape)
    if c_val.dim() > op_val.dim() or any(d != 1 for i, d in enumerate(padded) if i != axis) \
            or padded[axis] not in (1, channels):
        raise _NotFused(f"{c.name} of shape {list(c_val.shape)} does not broadcast per output channel "
                        f"(dim {axis}) of {w_op.node.name}")

def _channel_vector(make: NodeMaker, c: Any, node: torch.fx.Node, w_op: WeightOp) -> torch.fx.Node:
    """`c` (checked: `_channel_check`) as a constant node of shape [channels] in the compute dtype."""
    compute, channels = compute_dtype(val(w_op.weight).dtype), w_op.channels
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return make.full(channels, float(c), compute, f"{node.name}_constant")
    padded = [1] * (val(w_op.node).dim() - val(c).dim()) + list(val(c).shape)
    flat = make.make(make.ops.view, (make.cast(c, compute), [-1]), f"{node.name}_vector")
    if padded[w_op.channel_axis] == 1:
        flat = make.make(make.ops.expand, (flat, [channels]), f"{node.name}_expanded")
    return flat


def _eval_batch_norm(bn: torch.fx.Node, name: str) -> tuple:
    """(output node, input, (gamma, beta, mean, var, eps)) of an eval-mode batch norm on a
    float input with a static channel count and no encoding at it; else `_NotFused`."""
    w_i, b_i, m_i, v_i, e_i, t_i, tuple_result = BATCH_NORMS[name]
    if t_i is not None and arg_at(bn, t_i):
        raise _NotFused("training-mode batch norm (batch statistics)")
    out, x = batch_norm_output(bn, tuple_result), bn.args[0]
    stats = tuple(arg_at(bn, i) for i in (w_i, b_i, m_i, v_i, e_i))
    x_val = val(x)
    if out is None:
        raise _NotFused("its saved statistics (outputs 1 and 2) are read")
    if not isinstance(x_val, torch.Tensor) or x_val.dtype not in FLOATS or x_val.dim() < 2:
        raise _NotFused("input is not a floating-point tensor of rank >= 2")
    if not isinstance(x_val.shape[1], int):
        raise _NotFused(f"symbolic channel count {x_val.shape[1]}")
    if stats[2] is None or stats[3] is None or not isinstance(stats[4], (int, float)):
        raise _NotFused("no running statistics")
    if is_dequantize(getattr(x, "target", None)) or any(is_quantize(u.target) for u in out.users):
        raise _NotFused("quantized operands: a quantize/dequantize pair at the batch norm (its encoding "
                        "was chosen for the batch norm's output; rewriting it would need another)")
    return out, x, stats[:4] + (float(stats[4]),)


class _Rewriter:
    """The rewrite of one graph, candidate by candidate in `_candidates`' order (chains from each
    weight op by target then graph order, breadth-first; then other batch norms); its records
    are the `Fusion`'s."""

    def __init__(self, make: NodeMaker, conditions: _Conditions) -> None:
        self.make, self.ops, self.check = make, make.ops, conditions
        self.graph = make.graph
        self.dead: set[torch.fx.Node] = set()
        self.renamed: dict[str, str] = {}
        self.replaced: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.decisions: list[Decision] = []
        self.changed = False

    def visit(self, node: torch.fx.Node) -> None:
        if node in self.dead:
            return
        name = op_name(node.target)
        try:
            if name in TRAINING_BATCH_NORMS:
                raise _NotFused("training-mode batch norm (batch statistics)")
            if name in BATCH_NORMS:
                self._batch_norm(node, name)
            elif name in BINARY:
                self._binary(node, BINARY[name])
        except _NotFused as why:
            self.decisions.append(Decision(node.name, name, Reason.NOT_FUSED, str(why)))

    def _batch_norm(self, bn: torch.fx.Node, name: str) -> None:
        out, x, stats = _eval_batch_norm(bn, name)
        x_val = val(x)
        self.check.require_not_skipped(bn)
        for what, v in zip(("weight", "bias", "running mean", "running variance"), stats):
            self.check.require_constant(v, f"batch norm {what}")
        self.check.known.require_known_statistics(stats)
        why_not = self.check.fusible(x, batch_norm=True)
        w_op = weight_op(x)
        if why_not is None and w_op.channels != x_val.shape[1]:
            why_not = f"{x.name} has {w_op.channels} output channels, the batch norm {x_val.shape[1]}"
        if why_not is None:
            why_not = _movable(x, bn)
        if why_not is None:
            why_not = self.check.known.batch_norm_refusal(w_op, stats)
        if why_not is None:
            if self.check.rewrite_fits(w_op, True, True, bn, stats[:4]):
                return self._fuse_batch_norm(bn, out, w_op, stats)
            why_not = f"storing {x.name}'s new weight and bias exceeds the growth budget (its weight or bias is shared)"
        self.check.require_scale_and_shift(bn, x, stats, why_not)
        self._scale_and_shift(bn, out, x, stats, why_not)

    def _binary(self, node: torch.fx.Node, kind: str) -> None:
        op, c = _operands(node, kind, self.check.constness)
        w_op = weight_op(op)
        if w_op is None:
            return _require_no_view_between(node)  # or a rewrite before changed what it reads
        if arg_at(node, 2) not in (None, 1):
            raise _NotFused(f"alpha={arg_at(node, 2)}")
        if isinstance(c, torch.fx.Node) and self.check.constness(c) is not None:
            if kind in ("add", "sub"):
                return  # a residual or another runtime sum, not a shift
            raise _NotFused(f"runtime scale: {c.name} is {self.check.constness(c)}")
        self.check.require_not_skipped(node)
        why_not = self.check.fusible(op, batch_norm=False)
        if why_not is not None:
            raise _NotFused(why_not)
        _channel_check(c, node, w_op)  # every check before any edit (and before the budget)
        self.check.known.require_known_values(kind, c, w_op)
        why_not = _movable(op, node)
        if why_not is not None:
            raise _NotFused(why_not)
        scaled = kind in ("mul", "div")
        if not self.check.rewrite_fits(w_op, scaled, w_op.bias is not None or not scaled):
            raise _NotFused(f"storing {op.name}'s new weight and bias exceeds the growth budget (its weight or bias is shared)")
        node.prepend(op)  # after every constant the binary op reads (only `node` reads the op; `_movable`)
        with self.graph.inserting_before(op):
            c_vec = _channel_vector(self.make, c, node, w_op)
            weight, bias = binary_operands(self.make, w_op, kind, c_vec)
        self._fused(node, [node], w_op, weight, bias)

    def _fuse_batch_norm(self, bn, out, w_op: WeightOp, stats) -> None:
        bn.prepend(w_op.node)  # after every constant the batch norm reads (only `bn` reads the op; `_movable`)
        with self.graph.inserting_before(w_op.node):
            weight, bias = batch_norm_operands(self.make, w_op, stats, bn.name)
        self._fused(out, list(dict.fromkeys((bn, out))), w_op, weight, bias)

    def _fused(self, out: torch.fx.Node, removed: list, w_op: WeightOp, weight, bias) -> None:
        """`w_op` reads `weight` and `bias`; the readers of `out` read it; `removed` (`out`
        and what computed it) leave the graph, each reported `Reason.FUSED`; an output spec
        naming `out` names the op."""
        fused = self.make.with_operands(w_op, weight, bias)
        first = removed[0]
        self.notes.append(f"{first.name} ({op_name(first.target)}) folded into the weight and bias of {fused.name}")
        self.decisions += [Decision(n.name, op_name(n.target), Reason.FUSED, f"into {fused.name}") for n in removed]
        self._replaced(out, fused, removed)

    def _replaced(self, out: torch.fx.Node, new: torch.fx.Node, removed: list) -> None:
        """The readers of `out` read `new` (an output spec naming `out` names `new`);
        `removed` leave the graph."""
        if any(u.op == "output" for u in out.users):
            self.renamed[out.name] = new.name
        self.replaced.append((out.name, new.name))
        out.replace_all_uses_with(new)
        for n in reversed(removed):
            self.dead.add(n)
            self.graph.erase_node(n)
        self.changed = True

    def _scale_and_shift(self, bn, out, x, stats, why_not: str) -> None:
        """``(x - centre) * s + t`` by constants viewed [C, 1, ...] (`weight_ops.scale_and_shift`:
        ``x * s + t`` in fp32, ``(x - mean) * s + beta`` in fp16 and bf16)."""
        with self.graph.inserting_before(bn):
            shifted = scale_and_shift(self.make, x, stats, bn)
        self.notes.append(f"{bn.name} ({op_name(bn.target)}) rewritten as a per-channel multiply and add "
                          f"({shifted.name}; not fused into a weight: {why_not})")
        removed = list(dict.fromkeys((bn, out)))
        self.decisions += [Decision(n.name, op_name(n.target), Reason.SCALE_AND_SHIFT, why_not) for n in removed]
        self._replaced(out, shifted, removed)
