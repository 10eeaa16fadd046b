"""Whether a row's ``.pte`` computes its model: the tolerance of each precision and the status
that follows from a measured difference. One rule for every backend: the CPU rows
(`benchmarks.runner`) and the QNN rows (`benchmarks.qnn_rows`) are judged here.

A difference is judged relative to the output's scale, max |reference output| (the reference is
the float eager model, or for a quantized row the converted q/dq program run in eager):

- ``fp32`` (portable, XNNPACK): `FLOAT_RTOL`. fp32 kernels reorder sums; measured <= 1.1e-5 of
  the scale on the benchmark models.
- ``fp16`` (HTP): the larger of `FP16_RTOL` of the scale (the floor) and `FP16_SAFETY` times
  the model's own fp16 error on the row's inputs: max |output computed in fp16 arithmetic on
  the CPU - eager| (`benchmarks.fp16_emulation`: fp16 operands and results for every op, and
  convolutions and matrix products accumulated in fp16, rounded after every term; torch's own
  CPU fp16 kernels accumulate in fp32 and see a quarter of HTP's error). HTP computes every op in
  fp16 (unit roundoff 2^-11 = 4.9e-4), so its error grows with the model as the emulation's
  does: on the real backend, models with their batch norms folded (so no builder fault is left)
  are 0.42x-1.51x their emulated error (mobilenet_v3_small as the benchmark builds it: HTP
  1.8e-3, emulated 1.38e-3 at a scale of 0.158; five conv/linear/batch-norm blocks with fold on
  0.42x-1.51x, `tests/qnn/test_batch_norm_htp.py`; table in `docs/benchmarks.md`, "The fp16
  bound"), so `FP16_SAFETY` = 4 leaves a 2.6x margin, while the builder fault that ignores eps
  is 22x (the blocks) to 2,400x (13.5 on mobilenet_v3_small) beyond the bound. The emulation
  is pessimistic for wide reductions, which HTP sums more precisely (resnet18 0.08x, llama
  0.20x, t5_encoder 0.24x its emulated error): there the bound is loose, up to 2.7 % of the
  scale on resnet18, though those rows sit inside the floor and never reach it. The floor,
  1e-2 of the scale (about 20 unit roundoffs; measured 5.5e-4 (resnet18) to 4.7e-3 (swin_v2_t)
  on the benchmark models), keeps every row the earlier fixed bound passed passing; the emulation
  runs only for a row whose difference exceeds the floor (`tolerance_of`), and each row names
  the bound that applied (`Tolerance.rule`).
- ``8a8w`` (XNNPACK ``*_q8`` rows, HTP): `QUANTIZED_RTOL`. The eager q/dq program computes each
  op in fp32 between fake-quantizations while the ``.pte`` runs integer kernels that requantize
  at every op, each rounding by up to half a step of that op's 8-bit encoding (about 0.4 % of
  its range); measured 5.9 % (portable) and 8.3 % (XNNPACK) of the scale on
  mobilenet_v3_small_q8, and 1.4 % (resnet18) to 10 % (llama) on HTP outside the known
  faults. 0.15 is about 19 steps of an 8-bit output encoding spanning +-scale.
- ``16a4w`` (HTP): `A16_RTOL`. 16-bit activations round 256 times finer than 8-bit ones, and
  the 4-bit weights are the same integers on both sides, so requantization alone stays far below
  1 %; HTP computes some ops (softmax, normalisations) through fp16 internally, whose bound above
  applies. Measured 0.5 % on llama 16a4w; 0.03 leaves a 6x margin.

A reference whose scale is below `MIN_SCALE` proves nothing by matching (a randomly initialised
model can output ~1e-9): such a row is not passed but reported as ``unverified``, whatever the
difference. Integer outputs must match exactly. A difference or scale that is NaN or infinite
is a ``mismatch`` (``NaN > tolerance`` is false, so it is checked first): a ``.pte`` that outputs
NaN never reads ``ok``.
"""

from __future__ import annotations

import math

import dataclasses
from typing import Callable, Optional, Union

FLOAT_RTOL = 1e-4
FP16_RTOL = 1e-2
QUANTIZED_RTOL = 0.15
A16_RTOL = 3e-2
MIN_SCALE = 1e-3
FP16_SAFETY = 4.0
"""fp16 rows: the bound is this many times the model's emulated fp16 error (module docstring)."""

RTOL = {"fp32": FLOAT_RTOL, "fp16": FP16_RTOL, "8a8w": QUANTIZED_RTOL, "16a4w": A16_RTOL}
"""Relative tolerance (a fraction of the output's scale) of each precision."""


def relative_tolerance(precision: str) -> float:
    """The tolerance of `precision` as a fraction of the output's scale (module docstring).

    Raises:
        KeyError: a precision without a stated tolerance.
    """
    return RTOL[precision]


def tolerance(precision: str, scale: float) -> float:
    """Largest max-abs difference that is still ``ok`` for an output of `scale` (max |reference|)
    by the precision's relative tolerance alone (for fp16 the floor; `tolerance_of`)."""
    return relative_tolerance(precision) * scale


Fp16Error = Union[float, Callable[[], Optional[float]], None]
"""The model's max abs error computed in fp16 arithmetic (`benchmarks.fp16_emulation.fp16_error`),
or a function computing it (called only when needed), or None (unknown)."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The largest max-abs difference still ``ok`` for one row, and which bound gave it.

    Attributes:
        limit: the tolerance, in the output's units.
        rule: the bound that applied, for the row's text: ``"0.01 of scale 0.158"`` or
            ``"4 x fp16-emulated error 0.00138 (floor 0.00158)"``.
        fp16_error: the emulated fp16 error when it was computed, else None.
    """

    limit: float
    rule: str
    fp16_error: Optional[float] = None


def tolerance_of(precision: str, scale: float, max_abs_diff: Optional[float] = None,
                 fp16_error: Fp16Error = None) -> Tolerance:
    """The tolerance that applies to a difference `max_abs_diff` from a reference of `scale`.

    For ``fp16`` with `fp16_error` given, the larger of the floor (`FP16_RTOL` of the scale) and
    `FP16_SAFETY` times the emulated error (module docstring); the emulation (a callable
    `fp16_error`) runs only when `max_abs_diff` exceeds the floor, since below it the row is
    ``ok`` whatever the larger bound. Every other precision: `tolerance`.

    Raises:
        KeyError: a precision without a stated tolerance."""
    floor = tolerance(precision, scale)
    base = Tolerance(floor, f"{relative_tolerance(precision):g} of scale {scale:.3g}")
    if precision != "fp16" or fp16_error is None or max_abs_diff is None or max_abs_diff <= floor:
        return base
    error = fp16_error() if callable(fp16_error) else fp16_error
    if error is None:
        return base
    if FP16_SAFETY * error <= floor:
        return Tolerance(floor, f"{base.rule} (above {FP16_SAFETY:g} x fp16-emulated error {error:.3g})", error)
    return Tolerance(FP16_SAFETY * error, f"{FP16_SAFETY:g} x fp16-emulated error {error:.3g} "
                                          f"(floor {FP16_RTOL:g} of scale {scale:.3g})", error)


def judge(precision: str, max_abs_diff: Optional[float], scale: Optional[float],
          integer_mismatch: Optional[float] = None, *, what: str = "eager",
          fp16_error: Fp16Error = None, bound: Optional[Tolerance] = None) -> str:
    """The status of one comparison of a ``.pte``'s outputs with their reference.

    Args:
        precision: the row's precision (`RTOL`'s keys).
        max_abs_diff: max |output - reference| over the float outputs (None: no float output).
        scale: max |reference| over the same outputs.
        integer_mismatch: fraction of integer output elements that differ (None: none).
        what: the reference's name in the status text.
        fp16_error: fp16 rows: the model's emulated fp16 error, or a function computing it
            (`tolerance_of`); without it an fp16 row is judged at the floor.
        bound: the tolerance to apply, when the caller has it already (`tolerance_of`).

    Returns:
        ``"ok"``; ``"mismatch: ..."`` naming the difference (or that it or the scale is NaN or
        infinite), the tolerance, the bound that
        applied and the reference; or ``"unverified: ..."`` when the reference's scale is below
        `MIN_SCALE`.
    """
    if integer_mismatch:
        return f"mismatch: {100 * integer_mismatch:.3g} % of integer elements differ from {what}"
    if max_abs_diff is None:
        return "ok"
    if not math.isfinite(max_abs_diff) or (scale is not None and not math.isfinite(scale)):
        # NaN > tolerance is false: without this a .pte that outputs NaN would read `ok`
        return f"mismatch: max abs diff vs {what} {max_abs_diff:.3g} (output scale {scale}): not finite"
    if scale is None or scale < MIN_SCALE:
        return f"unverified: {what} output scale {scale or 0:.3g} < {MIN_SCALE}: nothing to compare"
    limit = bound or tolerance_of(precision, scale, max_abs_diff, fp16_error)
    if max_abs_diff > limit.limit:
        return f"mismatch: max abs diff vs {what} {max_abs_diff:.3g} > tolerance {limit.limit:.3g} ({limit.rule})"
    return "ok"
