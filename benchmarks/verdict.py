"""Whether a row's ``.pte`` computes its model: the tolerance of each precision and the status
that follows from a measured difference. One rule for every backend: the CPU rows
(`benchmarks.runner`) and the QNN rows (`benchmarks.qnn_rows`) are judged here.

A difference is judged relative to the output's scale, max |reference output| (the reference is
the float eager model, or for a quantized row the converted q/dq program run in eager):

- ``fp32`` (portable, XNNPACK): `FLOAT_RTOL`. fp32 kernels reorder sums; measured <= 1.1e-5 of
  the scale on the benchmark models.
- ``fp16`` (HTP): `FP16_RTOL`. HTP computes every op in fp16 (unit roundoff 2^-11 = 4.9e-4) and
  the models chain tens to hundreds of ops; measured 5.5e-4 (resnet18) to 4.7e-3 (swin_v2_t, 12
  blocks) of the scale on the benchmark models (`docs/benchmarks.md`), so 1e-2 (about 20 unit
  roundoffs, 2.1x the deepest model's) separates rounding from a wrong result.
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
difference. Integer outputs must match exactly. A NaN difference or scale is not caught
(``NaN > tolerance`` is false): a known gap, held by a strict xfail in
``tests/test_benchmark_verdict.py``.
"""

from __future__ import annotations

from typing import Optional

FLOAT_RTOL = 1e-4
FP16_RTOL = 1e-2
QUANTIZED_RTOL = 0.15
A16_RTOL = 3e-2
MIN_SCALE = 1e-3

RTOL = {"fp32": FLOAT_RTOL, "fp16": FP16_RTOL, "8a8w": QUANTIZED_RTOL, "16a4w": A16_RTOL}
"""Relative tolerance (a fraction of the output's scale) of each precision."""


def relative_tolerance(precision: str) -> float:
    """The tolerance of `precision` as a fraction of the output's scale (module docstring).

    Raises:
        KeyError: a precision without a stated tolerance.
    """
    return RTOL[precision]


def tolerance(precision: str, scale: float) -> float:
    """Largest max-abs difference that is still ``ok`` for an output of `scale` (max |reference|)."""
    return relative_tolerance(precision) * scale


def judge(precision: str, max_abs_diff: Optional[float], scale: Optional[float],
          integer_mismatch: Optional[float] = None, *, what: str = "eager") -> str:
    """The status of one comparison of a ``.pte``'s outputs with their reference.

    Args:
        precision: the row's precision (`RTOL`'s keys).
        max_abs_diff: max |output - reference| over the float outputs (None: no float output).
        scale: max |reference| over the same outputs.
        integer_mismatch: fraction of integer output elements that differ (None: none).
        what: the reference's name in the status text.

    Returns:
        ``"ok"``; ``"mismatch: ..."`` naming the difference, the tolerance and the reference; or
        ``"unverified: ..."`` when the reference's scale is below `MIN_SCALE`.
    """
    if integer_mismatch:
        return f"mismatch: {100 * integer_mismatch:.3g} % of integer elements differ from {what}"
    if max_abs_diff is None:
        return "ok"
    if scale is None or scale < MIN_SCALE:
        return f"unverified: {what} output scale {scale or 0:.3g} < {MIN_SCALE}: nothing to compare"
    limit = tolerance(precision, scale)
    if max_abs_diff > limit:
        return (f"mismatch: max abs diff vs {what} {max_abs_diff:.3g} > tolerance {limit:.3g} "
                f"({relative_tolerance(precision):g} of scale {scale:.3g})")
    return "ok"
