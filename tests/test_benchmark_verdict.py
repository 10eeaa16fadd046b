"""The benchmark's verdict on a row's output (`benchmarks/verdict.py`): one tolerance per
precision, relative to the output's scale; a reference too small to compare is not passed;
integers exact. The rule on a real HTP run is in `tests/qnn/test_qnn_rows.py`."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from benchmarks import figures, report, verdict


def test_tolerances_order_the_precisions_by_how_much_rounding_they_carry():
    rtol = verdict.RTOL
    assert rtol["fp32"] < rtol["fp16"] < rtol["16a4w"] < rtol["8a8w"] < 1
    # a difference that passes an 8-bit row is a wrong fp16 or fp32 result
    diff = 0.1
    assert verdict.judge("8a8w", diff, 1.0) == "ok"
    for precision in ("fp32", "fp16", "16a4w"):
        status = verdict.judge(precision, diff, 1.0)
        assert status.startswith("mismatch: max abs diff vs eager 0.1 > tolerance"), status


@given(scale=st.floats(1e-3, 1e3), fraction=st.floats(0, 0.99), precision=st.sampled_from(sorted(verdict.RTOL)))
def test_a_difference_inside_the_tolerance_passes_and_twice_it_does_not(scale, fraction, precision):
    limit = verdict.tolerance(precision, scale)
    assert verdict.judge(precision, fraction * limit, scale) == "ok"
    assert verdict.judge(precision, 2 * limit, scale).startswith("mismatch")


@pytest.mark.parametrize("diff", [0.0, 1e-12, 5.0])
def test_a_reference_near_zero_is_never_passed(diff):
    """A randomly initialised model can output ~1e-9: matching it proves nothing, whatever the
    difference, so the row says so instead of ``ok``."""
    status = verdict.judge("fp16", diff, 1e-9)
    assert status.startswith("unverified: eager output scale 1e-09 < 0.001"), status


def test_integer_outputs_must_match_exactly():
    assert verdict.judge("fp16", 0.0, 1.0, integer_mismatch=0.25).startswith("mismatch: 25 % of integer elements")
    assert verdict.judge("fp16", None, None, integer_mismatch=0.0) == "ok"


def test_the_fold_off_comparison_names_its_reference():
    status = verdict.judge("8a8w", 0.5, 1.0, what="fold off on HTP")
    assert status.startswith("mismatch: max abs diff vs fold off on HTP 0.5 > tolerance 0.15"), status


def test_table_legend_and_figure_say_mismatch():
    ok = {"model": "m", "variant": "none", "backend": "qnn", "precision": "fp16", "status": "ok", "pte_bytes": 100}
    bad = dict(ok, variant="fold_constants", pte_bytes=90, status=verdict.judge("fp16", 1.0, 1.0),
               vs_off_max_abs_diff=0.5)
    table = report.to_markdown([ok, bad])
    assert "| mismatch: max abs diff vs eager 1 > tolerance 0.01" in table and "| 5.00e-01 |" in table
    assert "fp16 0.01" in report.COLUMN_LEGEND["max_abs_diff"]
    assert figures.verdict_mark(bad) == " mismatch" and figures.verdict_mark(ok) == ""


def test_results_md_names_the_cause_of_every_qnn_mismatch():
    """A fault the run matched, a recorded finding, or says it is unattributed; a row's other note
    (the fold had nothing to do) is not a cause."""
    base = {"backend": "qnn", "variant": "none", "pte_bytes": 1, "status": verdict.judge("8a8w", 1.0, 1.0)}
    rows = [dict(base, model="m", precision="fp16", mismatch_cause="executorch 1.5.1: something"),
            dict(base, model="vit_b_16", precision="8a8w"),
            dict(base, model="other", precision="8a8w", note="the fold had nothing to do")]
    text = report.qnn_notes_md(rows)
    assert "- m fp16 none: mismatch: max abs diff vs eager 1 > tolerance 0.15 (0.15 of scale 1). Cause: executorch 1.5.1" in text
    assert "- vit_b_16 8a8w none: mismatch" in text and "Explained by an investigation" in text
    assert "- other 8a8w none: mismatch" in text and "Not attributed" in text
