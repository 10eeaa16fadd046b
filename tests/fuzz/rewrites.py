"""What the weight-fusion rewrite's rounding bound (`tests/fusion_bounds.py`) cannot see, checked
value by value on the values it replaced (`folding.rewrites.weight_fusion.Fusion.replaced`).

The bound says how far rounding may move a rewritten value, relative to its magnitude. Two
changes are not rounding, and the fuzzer checks them on their own (issue 62):

- ``fusion-zero-sign``: a rewritten zero whose sign differs from the original's where the weight
  op's own result was not zero, so the zero comes from a scale, not from a cancelled sum
  (``linear(x) * 0.0`` is ``-0.0`` where ``linear(x) < 0``; ``linear(x, W * 0.0)`` is ``+0.0``,
  and ``1 / `` of it ``+inf`` where eager gives ``-inf``). A zero that the weight op itself
  computed may change sign (a sum of products that cancels exactly is ``+0.0`` in either order).
- ``fusion-mixed-precision``: a batch norm whose activations are fp16 or bf16 and whose
  statistics are fp32 computes in fp32 and rounds once (ATen's CPU kernel); where nothing is
  fused into a weight (the batch norm alone is rewritten as a multiply and add), the rewritten
  value must be within one unit in the last place of the activation dtype of the original,
  plus the fp32 rounding of its terms: a rewrite that rounds the statistics to fp16 first
  moves a large mean's rounding into the output.
"""

from __future__ import annotations

import operator
from typing import Iterator, Optional, Sequence

import torch
import torch.fx
from torch.export import ExportedProgram

_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def rewrite_problems(original: ExportedProgram, rewritten: ExportedProgram, replaced: Sequence[tuple[str, str]],
                     inputs: Sequence) -> Iterator[tuple[str, str]]:
    """``(check, message)`` for each replaced value whose zero signs or mixed-precision batch
    norm the rewrite changed (module docstring), on `inputs`; the values before and after are
    computed as `tests.fusion_bounds.rewrite_problem` computes them (replayed inputs, seeded RNG)."""
    from tests.fusion_bounds import _module, _replayable, values_by_name

    if not replaced:
        return
    gm = _module(original)
    before = values_by_name(gm, inputs)
    after = values_by_name(_module(rewritten), inputs, _replayable(gm, before), frozenset(new for _, new in replaced))
    nodes = {n.name: n for n in gm.graph.nodes}
    new_nodes = {n.name: n for n in rewritten.graph.nodes}
    for new, old in {new: old for old, new in replaced}.items():
        want, got = before.get(old), after.get(new)
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor) or want.shape != got.shape:
            continue
        problem = _zero_sign(nodes[old], want, got, before)
        if problem:
            yield "fusion-zero-sign", f"{old} -> {new}: {problem}"
        problem = _mixed_precision(nodes[old], new_nodes.get(new), want, got, before)
        if problem:
            yield "fusion-mixed-precision", f"{old} -> {new}: {problem}"


def _chain_input(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The weight op (conv, linear) or batch-norm input at the start of the chain of scales,
    shifts and batch norms that ends at `node`, or None when there is none."""
    from folding.core.ops import op_name
    from folding.rewrites.weight_ops import BATCH_NORMS, BINARY, weight_op

    n = node
    for _ in range(16):
        if not isinstance(n, torch.fx.Node) or n.op != "call_function":
            return None
        if weight_op(n) is not None:
            return n
        name = op_name(n.target)
        if n.target is operator.getitem or name in BATCH_NORMS:
            n = n.args[0]
            continue
        if name in BINARY:
            computed = [a for a in n.args[:2] if isinstance(a, torch.fx.Node) and a.op == "call_function"]
            if not computed:
                return None
            n = computed[0]
            continue
        return n  # what a batch norm with nothing to fuse into normalises
    return None


def _zero_sign(old: torch.fx.Node, want: torch.Tensor, got: torch.Tensor, values: dict) -> Optional[str]:
    if not want.is_floating_point() or not got.is_floating_point():
        return None
    flipped = (want == 0) & (got == 0) & (torch.signbit(want) != torch.signbit(got))
    if not bool(flipped.any()):
        return None
    start = _chain_input(old)
    y = values.get(start.name) if start is not None else None
    if not isinstance(y, torch.Tensor) or not y.is_floating_point():
        return None
    try:
        y = torch.broadcast_to(y, want.shape)
    except RuntimeError:
        return None
    made = flipped & (y != 0)  # a zero made by the chain's constants, not by the weight op's sum
    if not bool(made.any()):
        return None
    i = tuple(int(k) for k in made.nonzero()[0])
    return (f"{int(made.sum())} zeros of the other sign where {start.name} is not zero (at {i}: "
            f"{want[i].item()!r}, rewritten {got[i].item()!r}, {start.name} {y[i].item()!r})")


def _mixed_precision(old: torch.fx.Node, new: Optional[torch.fx.Node], want: torch.Tensor, got: torch.Tensor,
                     values: dict) -> Optional[str]:
    from folding.core.ops import op_name
    from folding.rewrites.weight_ops import BATCH_NORMS, weight_op

    bn = old.args[0] if old.target is operator.getitem else old
    if not isinstance(bn, torch.fx.Node) or bn.op != "call_function" or op_name(bn.target) not in BATCH_NORMS:
        return None
    if new is not None and weight_op(new) is not None:
        return None  # fused into a weight: the bound of tests/fusion_bounds.py
    w_i, b_i, m_i, v_i, e_i = BATCH_NORMS[op_name(bn.target)][:5]
    x = values.get(bn.args[0].name) if isinstance(bn.args[0], torch.fx.Node) else None
    stats = [values.get(a.name) if isinstance(a, torch.fx.Node) else None
             for a in (_arg(bn, w_i), _arg(bn, b_i), _arg(bn, m_i), _arg(bn, v_i))]
    mean, var = stats[2], stats[3]
    if not isinstance(x, torch.Tensor) or not isinstance(mean, torch.Tensor) or not isinstance(var, torch.Tensor):
        return None
    if x.dtype not in (torch.float16, torch.bfloat16) or mean.dtype != torch.float32 or want.dtype != x.dtype:
        return None
    weight = stats[0] if isinstance(stats[0], torch.Tensor) else torch.ones_like(mean)
    bias = stats[1] if isinstance(stats[1], torch.Tensor) else torch.zeros_like(mean)
    eps = float(_arg(bn, e_i))
    view = [-1] + [1] * (x.dim() - 2)
    s = (weight.double() / (var.double() + eps).sqrt()).abs().view(view)
    magnitude = s * (x.double().abs() + mean.double().abs().view(view)) + bias.double().abs().view(view)
    w, g = want.double(), got.double()
    tiny = torch.finfo(x.dtype).smallest_normal * torch.finfo(x.dtype).eps
    bound = 2 * _ROUNDOFF[x.dtype] * w.abs() + 16 * _ROUNDOFF[torch.float32] * magnitude + 2 * tiny
    same = (w == g) | (w.isnan() & g.isnan())
    ratio = ((g - w).abs() / bound).masked_fill(same, 0.0).nan_to_num(float("inf"))
    worst = ratio.max().item() if ratio.numel() else 0.0
    if worst <= 1.0:
        return None
    i = tuple(int(k) for k in (ratio == ratio.max()).nonzero()[0])
    return (f"{x.dtype} activations, fp32 statistics: {worst:.3g} x one {x.dtype} ulp plus the fp32 rounding "
            f"(at {i}: {want[i].item()!r}, rewritten {got[i].item()!r})")


def _arg(node: torch.fx.Node, i: Optional[int]):
    from folding.core.ops import arg_at

    return None if i is None else arg_at(node, i)
