"""Output comparison with per-dtype tolerances.

A float output matches when ``max|got - want| <= atol + rtol * max|want|`` (the tolerance scales
with the output's magnitude: random-weight networks have logits from 1e-2 to 1e3). Integer and
bool outputs must be equal. Shapes and dtypes must be equal.

=========================  ===============  ===============
comparison                 float32          float16/bfloat16
=========================  ===============  ===============
folded program vs eager    1e-5 + 1e-5·max  1e-2 + 1e-2·max
``.pte`` (XNNPACK) vs eager 1e-3 + 1e-3·max  1e-2 + 1e-2·max
=========================  ===============  ===============

The program tolerance covers what ``to_edge`` changes (decomposed attention, layer norm) and
no more; the ``.pte`` one covers XNNPACK's own kernels (other GEMM orders and fused ops).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

# (atol, rtol) per dtype kind and comparison.
PROGRAM_TOL = {"fp32": (1e-5, 1e-5), "half": (1e-2, 1e-2)}
PTE_TOL = {"fp32": (1e-3, 1e-3), "half": (1e-2, 1e-2)}


@dataclasses.dataclass
class Comparison:
    """Result of comparing outputs with the eager reference.

    Attributes:
        match: every output within its tolerance (integers exactly), same shapes and dtypes.
        max_abs_diff: max abs difference over the float outputs (0.0 when there are none).
        worst_ratio: max over float outputs of diff / tolerance (> 1 means out of tolerance).
        ints_equal: every integer/bool output equal (None when there are none).
        detail: why it does not match ("" when it does).
    """

    match: bool
    max_abs_diff: float = 0.0
    worst_ratio: float = 0.0
    ints_equal: Optional[bool] = None
    detail: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def as_tensors(out: Any) -> Tuple[torch.Tensor, ...]:
    """A model or program output (tensor, tuple, list) as a tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(t for t in out if isinstance(t, torch.Tensor))


def _kind(dtype: torch.dtype) -> str:
    return "half" if dtype in (torch.float16, torch.bfloat16) else "fp32"


def compare(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tolerances=PROGRAM_TOL) -> Comparison:
    """Compare `got` with the eager outputs `want` (see the module docstring for the rule)."""
    got, want = as_tensors(got), as_tensors(want)
    if len(got) != len(want):
        return Comparison(False, detail=f"{len(got)} outputs, eager has {len(want)}")
    result = Comparison(True)
    for i, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            return Comparison(False, detail=f"output {i}: {g.dtype}{tuple(g.shape)} != eager {w.dtype}{tuple(w.shape)}")
        if not w.dtype.is_floating_point:
            equal = torch.equal(g, w)
            result.ints_equal = equal if result.ints_equal is None else result.ints_equal and equal
            if not equal:
                n = int((g != w).sum())
                result.match = False
                result.detail = result.detail or f"output {i} ({w.dtype}): {n}/{w.numel()} elements differ"
            continue
        if not torch.isfinite(w).all():
            same_nonfinite = torch.equal(torch.isfinite(g), torch.isfinite(w))
            g, w = g[torch.isfinite(w)], w[torch.isfinite(w)]
            if not same_nonfinite:
                result.match = False
                result.detail = result.detail or f"output {i}: non-finite values differ"
        diff = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
        scale = float(w.double().abs().max()) if w.numel() else 0.0
        atol, rtol = tolerances[_kind(w.dtype)]
        ratio = diff / (atol + rtol * scale) if diff == diff else float("inf")
        result.max_abs_diff = max(result.max_abs_diff, diff) if diff == diff else float("nan")
        result.worst_ratio = max(result.worst_ratio, ratio)
        if not ratio <= 1.0:
            result.match = False
            result.detail = result.detail or f"output {i}: max abs diff {diff:.3g} > {atol:g} + {rtol:g}·{scale:.3g}"
    return result
