"""The benchmark table (`benchmarks/report.py`): latency marks and the legend written with it.

Rows are plain dicts as `benchmarks.runner.Row.to_dict` makes them; no model is built."""

from __future__ import annotations

from benchmarks import report
from benchmarks.runner import Row


def _row(variant="none", **kw):
    row = Row("resnet18", variant, "xnnpack", pte_bytes=1000, latency_ms=10.0, latency_runs=5,
              latency_min_ms=9.0, latency_max_ms=11.0, load_average=0.5).to_dict()
    row.update(kw)
    return row


def _latency_cell(table: str, line: int) -> str:
    column = [key for key, _ in report.COLUMNS].index("latency_ms")
    return table.splitlines()[line].strip("| ").split(" | ")[column]


def test_latency_phase_records_the_median_the_spread_and_the_load(tmp_path):
    """`runner.measure_latency` on a real .pte: the median of the timed calls, their fastest and
    slowest, the load average; a cold run over the budget is reported as is."""
    import torch

    from benchmarks.runner import measure_latency
    from tests.lowering import lower_pte

    x = torch.randn(8, 8)
    pte, inputs = tmp_path / "m.pte", tmp_path / "inputs.pt"
    pte.write_bytes(lower_pte(torch.export.export(torch.nn.Linear(8, 8).eval(), (x,))))
    torch.save((x,), inputs)
    row = Row("m", "none", "portable", cold_run_ms=1.0, pte_path=str(pte), inputs_path=str(inputs))
    measure_latency(row, runs=5, budget_s=10.0)
    assert row.status == "ok" and row.latency_runs == 5, row.status
    assert 0 < row.latency_min_ms <= row.latency_ms <= row.latency_max_ms
    assert row.load_average is not None and row.load_average >= 0
    slow = Row("m", "none", "portable", cold_run_ms=5000.0, pte_path=str(pte), inputs_path=str(inputs))
    measure_latency(slow, runs=5, budget_s=1.0)
    assert (slow.latency_ms, slow.latency_runs, slow.latency_min_ms) == (5000.0, 0, None)


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


# -- QNN rows in the one table and the figures ---------------------------------------------------

def _qnn(variant, precision="fp16", **kw):
    row = Row("llama", variant, "qnn", precision=precision, pte_bytes=1000, fold_time_s=0.1, lower_time_s=2.0,
              max_abs_diff=0.003, eager_max_abs=2.0, partitions=1, refused_partitions=0, cpu_ops={},
              context_binary_bytes=900).to_dict()
    row.update(kw)
    return row


def _cells(table: str, line: int) -> dict:
    titles = [t for _, t in report.COLUMNS]
    return dict(zip(titles, table.splitlines()[line].strip("| ").split(" | ")))


def test_qnn_rows_share_the_table_with_their_own_columns_and_a_baseline_per_precision():
    cpu = _row()
    off = _qnn("none", pte_bytes=2000, partitions=2, refused_partitions=1,
               cpu_ops={"aten.index.Tensor": 4, "aten._to_copy.default": 4, "aten.slice_copy.Tensor": 3, "aten.mul.Tensor": 1})
    on = _qnn("fold_constants", pte_bytes=1990)
    q_off = _qnn("none", "16a4w", pte_bytes=500)
    q_on = _qnn("fold_constants", "16a4w", pte_bytes=450, note="the fold had nothing to do")
    table = report.to_markdown([cpu, off, on, q_off, q_on])
    c = _cells(table, 2)
    assert (c["backend"], c["precision"], c["QNN partitions (refused)"], c["ops left on CPU"]) == ("xnnpack", "—", "—", "—")
    c = _cells(table, 3)
    assert c["QNN partitions (refused)"] == "2 (1)"
    assert c["ops left on CPU"] == "12: index.Tensor×4, _to_copy×4, slice_copy.Tensor×3, …"
    assert c["latency ms"] == "—" and c["nodes aten/edge"] == "—"
    assert c["max abs diff"] == "3.00e-03 (scale 2)"
    c = _cells(table, 4)
    assert c["Δ .pte vs none"] == "-10 (-0.500%)" and c["ops left on CPU"] == "0" and c["context-binary bytes"] == "900"
    c = _cells(table, 6)  # against the 16a4w none row, not the fp16 one
    assert c["Δ .pte vs none"] == "-50 (-10.000%)"
    assert c["status"] == "ok (the fold had nothing to do)"


def test_size_panel_marks_failed_and_skipped_rows_instead_of_drawing_zero():
    from benchmarks import figures

    rows = [_qnn("none", pte_bytes=2000), _qnn("constant_prop_pass", pte_bytes=None, status="error (lower): X"),
            _qnn("fold_constants", pte_bytes=1990),
            _qnn("none", "8a8w", pte_bytes=None, status="error (lower): stranded"),
            _qnn("fold_constants", "8a8w", pte_bytes=900),
            _qnn("none", "16a4w", pte_bytes=None, status="skipped: no QNN libraries"),
            _qnn("fold_constants", "16a4w", pte_bytes=None, status="skipped: no QNN libraries")]
    bars = figures.pte_change_panel(rows, "qnn", ["constant_prop_pass", "fold_constants"])
    assert bars == [("llama\nfp16", "constant_prop_pass", "failed"), ("llama\nfp16", "fold_constants", -0.5),
                    ("llama\n8a8w", "fold_constants", "none failed"), ("llama\n16a4w", "fold_constants", "skipped")]


def test_cpu_ops_chart_has_a_bar_per_qnn_row_and_marks_the_failed_ones(tmp_path):
    from benchmarks import figures

    rows = [_row(), _qnn("none", cpu_ops={"aten.index.Tensor": 21}, refused_partitions=1),
            _qnn("constant_prop_pass", pte_bytes=None, cpu_ops=None, status="error (lower): X"),
            _qnn("fold_constants")]
    assert figures.cpu_ops_panel(rows) == [("llama\nfp16", "none", 21, 1), ("llama\nfp16", "constant_prop_pass", "failed", 0),
                                           ("llama\nfp16", "fold_constants", 0, 0)]
    paths = report.write_all(rows, str(tmp_path), {})
    assert paths["qnn_cpu_ops_png"].endswith("qnn_cpu_ops.png") and paths["png"].endswith("pte_size_change.png")
    md = open(paths["md"]).read()
    assert "## QNN" in md and "### llama / constant_prop_pass / qnn / fp16" not in md  # no traceback given
    assert figures.cpu_ops_panel([_row()]) == [] and figures.plot_qnn_cpu_ops([_row()], str(tmp_path / "x.png")) is None


def test_the_run_fails_on_cpu_errors_and_on_fold_on_qnn_regressions_only():
    from benchmarks.__main__ import failures
    from benchmarks.qnn_unit import regressions

    by_design = [_qnn("none", status="error (lower): RuntimeError: stranded"), _qnn("fold_constants"),
                 _qnn("constant_prop_pass", status="error (lower): RuntimeError: mixed types")]
    skipped = [_qnn("none", "8a8w", status="skipped: no QNN"), _qnn("fold_constants", "8a8w", status="skipped: no QNN")]
    assert failures([_row()] + by_design + skipped, regressions) == []
    regression = [_qnn("none", "16a4w"), _qnn("fold_constants", "16a4w", status="error (lower): RuntimeError: x")]
    assert [r["precision"] for r in failures(by_design + regression, regressions)] == ["16a4w"]
    assert len(failures([_row(status="error (run): x")], regressions)) == 1


def test_the_exit_status_is_as_documented_for_judged_rows():
    """docs/benchmarks.md, "Exit status": a CPU ``mismatch`` or ``unverified`` row fails the run; a
    QNN fold-on status other than an error counts unless it is the fold-off row's text, so a fold-on
    mismatch beside a fold-off mismatch with other numbers counts (the doc says so; change both)."""
    from benchmarks import verdict
    from benchmarks.__main__ import failures
    from benchmarks.qnn_unit import regressions

    for status in (verdict.judge("fp32", 1.0, 1.0), verdict.judge("fp32", 0.0, 1e-9)):
        assert len(failures([_row(status=status)], regressions)) == 1, status
    off, on = verdict.judge("8a8w", 1.77, 1.53), verdict.judge("8a8w", 1.76, 1.53)
    assert off.startswith("mismatch") and on.startswith("mismatch")
    assert failures([_qnn("none", "8a8w", status=off), _qnn("fold_constants", "8a8w", status=off)], regressions) == []
    assert len(failures([_qnn("none", "8a8w", status=off), _qnn("fold_constants", "8a8w", status=on)], regressions)) == 1
