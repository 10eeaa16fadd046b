"""The benchmark table (`benchmarks/report.py`): latency marks and the legend written with it.

Rows are plain dicts as `benchmarks.runner.Row.to_dict` makes them; no model is built."""

from __future__ import annotations

import dataclasses

from benchmarks import report
from benchmarks.runner import Row


def _row(variant="none", **kw):
    row = Row("resnet18", variant, "xnnpack", pte_bytes=1000, latency_ms=10.0, latency_runs=5,
              latency_min_ms=9.0, latency_max_ms=11.0, load_average=0.5).to_dict()
    row.update(kw)
    return row


def _latency_cell(table: str, line: int) -> str:
    return table.splitlines()[line].split(" | ")[-2]


def test_row_records_latency_spread_and_load():
    fields = {f.name for f in dataclasses.fields(Row)}
    assert {"latency_min_ms", "latency_max_ms", "load_average"} <= fields


def test_noisy_mark_only_above_the_spread_threshold():
    quiet = _row()                                                   # 11/9 = 1.22
    noisy = _row("fold_constants", latency_min_ms=8.0, latency_max_ms=16.0)  # 2.0
    edge = _row("constant_prop_pass", latency_min_ms=10.0, latency_max_ms=15.0)  # exactly 1.5: not noisy
    cold = _row("fold_strict", latency_runs=0, latency_min_ms=None, latency_max_ms=None)
    table = report.to_markdown([quiet, noisy, edge, cold])
    assert _latency_cell(table, 2) == "10.0"
    assert _latency_cell(table, 3) == "10.0 noisy ×2.0"
    assert _latency_cell(table, 4) == "10.0"
    assert _latency_cell(table, 5) == "10.0*"
    assert report.latency_spread(noisy) == 2.0 and report.is_noisy(noisy)
    assert not report.is_noisy(edge) and report.latency_spread(cold) is None
    # one timed call has no spread, whatever its min/max say
    assert report.latency_spread(_row(latency_runs=1, latency_min_ms=1.0, latency_max_ms=9.0)) is None


def test_results_md_has_a_legend_with_every_column_the_marks_and_the_noise(tmp_path):
    rows = [_row(), _row("fold_constants", latency_min_ms=8.0, latency_max_ms=16.0, load_average=2.25)]
    meta = {"load_average": "2.10 1.50 1.20", "machine": "x86_64, 2 cpus"}
    paths = report.write_all(rows, str(tmp_path), meta)
    md = open(paths["md"]).read()
    legend = md[md.index("## Legend"):]
    assert md.index("| model |") < md.index("## Legend")
    for _, title in report.COLUMNS:
        assert f"- **{title}**: " in legend, title
    assert "docs/benchmarks.md" in legend
    assert "`*`: a single cold run" in legend and "`noisy ×S`" in legend and "S > 1.5" in legend
    assert "Noise: 1 of 2 timed rows noisy" in legend
    assert "while rows were timed 0.50–2.25" in legend
    assert "at the end of the run: 2.10 1.50 1.20 (x86_64, 2 cpus)" in legend
