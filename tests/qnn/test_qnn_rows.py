"""The QNN benchmark rows (benchmarks/qnn_rows.py, and as rows of the main table through
benchmarks/qnn_unit.py) on tiny models, on the real HTP backend."""

from __future__ import annotations

import json

import torch

import qnn
from benchmarks import qnn_rows, qnn_unit, report
from benchmarks.runner import Row

from .helpers import STRANDED, compiler_specs, lower_with_wrapper
from .models import RELU, LinearCutOffByRelu, SkipIdShift


def _x(*shape):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(11)),)


def test_fold_off_row_reports_stranded_op_and_fold_on_row_delegates_and_runs(tmp_path):
    module, inputs = LinearCutOffByRelu().eval(), _x(4, 64)
    off, cpp, on = qnn_rows.lower_rows("linear_cut_off", module, inputs, "fp16", skip_node_op_set={RELU})
    assert (off.mode, cpp.mode, on.mode) == ("off", "constant_prop_pass", "on")
    assert off.status.startswith("error (lower): RuntimeError: ") and STRANDED in off.status
    assert off.partitions is None and off.fold_time_s is None and "Traceback" in off.traceback

    for row in (cpp, on):  # constant_prop_pass folds the constant linear as well
        assert row.status == "ok", row.traceback
        assert row.partitions == 1 and row.refused_partitions == 0 and row.static_partitions == 0
        assert row.cpu_ops == {} and row.cpu_op_count == 0
        assert row.fold_time_s > 0 and row.lower_time_s > 0
        assert row.wall_time_s >= row.fold_time_s + row.lower_time_s
        assert row.pte_bytes > row.constant_bytes_in_partitions
        # the emulated HTP's output against eager, relative to its scale (fp16)
        with torch.no_grad():
            scale = module(*inputs).abs().max().item()
        assert row.output_scale == scale
        assert 0 < row.htp_max_abs_diff <= 5e-3 * scale and row.htp_run_ms > 0
    # proj weight and bias, and the folded relu(linear(table, weight)): 4x64 fp32
    assert on.constant_bytes_in_partitions == (64 * 64 + 64 + 4 * 64) * 4
    assert on.constant_bytes_on_cpu == 0

    assert on.context_binary_bytes > 0 and on.peak_rss_bytes > 0 and on.fold_report["lifted"]

    rows = []
    for variant, q in zip(("none", "constant_prop_pass", "fold_constants"), (off, cpp, on)):
        row = Row("linear_cut_off", variant, "qnn", precision="fp16")
        qnn_unit.fill_row(row, q)
        rows.append(row.to_dict())
    assert rows[2]["max_abs_diff"] == on.htp_max_abs_diff and rows[2]["eager_max_abs"] == on.output_scale
    assert rows[2]["fold_time_s"] == on.fold_time_s and rows[0]["fold_time_s"] == 0.0
    assert rows[2]["note"] is None  # the fold lifted the constant branch
    table = report.to_markdown(rows)
    lines = table.splitlines()
    assert lines[-1].startswith(f"| linear_cut_off | fold_constants | qnn | fp16 | ok | {on.pte_bytes:,} | — | ")
    assert lines[-3].startswith("| linear_cut_off | none | qnn | fp16 | error (lower): RuntimeError: Node aten_linear_default")
    paths = report.write_all(rows, str(tmp_path), {"command": "test"})
    assert json.loads(open(paths["json"]).read())["rows"][2]["constant_bytes_in_partitions"] == 17664
    md = open(paths["md"]).read()
    assert "## Errors" in md and "### linear_cut_off / none / qnn / fp16" in md


def test_rows_agree_with_describe_partitions():
    """Nothing stranded: every mode lowers, and each row is what `qnn.describe_partitions` says
    of the same lowering. Without folding the constant branch joins the runtime one through the
    add, so its 4x16 table and 16x16 weight enter the partition; with folding its 4x16 result does."""
    module, inputs = SkipIdShift().eval(), _x(4, 16)
    off, cpp, on = qnn_rows.lower_rows("skip_id_shift", module, inputs, "fp16")
    for row in (off, on):
        assert row.status == "ok", row.traceback
        want = qnn.describe_partitions(lower_with_wrapper(module, inputs, compiler_specs(row.mode == "on")))
        assert row.partitions == want.partitions >= 1
        assert row.cpu_ops == want.cpu_ops
        assert row.constant_bytes_in_partitions == want.constant_bytes_in_partitions
        assert row.constant_bytes_on_cpu == want.constant_bytes_on_cpu
        assert row.static_partitions == 0 and row.refused_partitions == 0
    # fp32: proj weight and bias, plus the scalars of the muls QNN lifts to 1-element tensors,
    # each buffer padded to 16 bytes as the .pte stores it (folding.core.sizes.aligned)
    from folding.core.sizes import aligned

    proj, scalar = aligned(16 * 16 * 4) + aligned(16 * 4), aligned(4)
    assert off.constant_bytes_in_partitions == proj + aligned(4 * 16 * 4) + aligned(16 * 16 * 4) + 2 * scalar
    assert on.constant_bytes_in_partitions == proj + aligned(4 * 16 * 4) + scalar
    assert off.cpu_ops == on.cpu_ops == {}
    assert off.fold_time_s is None and on.fold_time_s > 0
    assert on.pte_bytes < off.pte_bytes  # the 16x16 weight is no longer stored
    # judged: against eager at fp16's tolerance, and the folding rows against fold off on HTP
    assert off.tolerance == on.tolerance == 1e-2 * on.output_scale
    assert off.htp_vs_off_max_abs_diff is None
    for row in (cpp, on):
        assert row.status == "ok" and row.htp_vs_off_max_abs_diff is not None
        assert row.htp_vs_off_max_abs_diff <= row.tolerance
        assert row.htp_max_abs_diff <= off.htp_max_abs_diff + row.htp_vs_off_max_abs_diff


def test_a_fold_on_failure_is_a_regression_only_where_fold_off_got_further():
    def row(model, variant, status):
        return {"model": model, "backend": "qnn", "precision": "fp16", "variant": variant, "status": status}

    rows = [row("a", "none", "error (lower): AssertionError: Failed to generate Qnn context binary."),
            row("a", "fold_constants", "error (lower): AssertionError: Failed to generate Qnn context binary."),
            row("b", "none", "ok"), row("b", "fold_constants", "error (lower): RuntimeError: x"),
            row("c", "none", "error (lower): RuntimeError: stranded"), row("c", "fold_constants", "ok")]
    assert [r["model"] for r in qnn_unit.regressions(rows)] == ["b"]


def test_qnn_messages_are_kept_when_htp_refuses():
    """What HTP prints when it refuses a compile reaches the row (executorch's exception only
    says "Failed to generate Qnn context binary")."""
    from .helpers import lower_executorch_stock

    import pytest

    with pytest.raises(AssertionError, match="Failed to generate Qnn context binary"):
        with qnn_rows._qnn_messages() as messages:
            lower_executorch_stock(LinearCutOffByRelu().eval(), _x(4, 64), {RELU}, fold=False)
    assert any("No graph inputs present for graph" in m for m in messages), messages


def test_a_fold_with_nothing_to_do_says_so_in_the_row():
    """A program with no constant-only op: the fold-on row is the fold-off row, and says why."""
    module, inputs = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), _x(4, 16)
    off, on = qnn_rows.lower_rows("plain_linear", module, inputs, "fp16", modes=("off", "on"))
    rows = {}
    for variant, q in (("none", off), ("fold_constants", on)):
        rows[variant] = Row("plain_linear", variant, "qnn", precision="fp16")
        qnn_unit.fill_row(rows[variant], q)
    assert rows["fold_constants"].status == "ok" and rows["fold_constants"].fold_report["lifted"] == []
    assert rows["fold_constants"].note.startswith("the fold had nothing to do")
    assert rows["none"].note is None and rows["fold_constants"].pte_bytes == rows["none"].pte_bytes
    assert 0 < rows["none"].context_binary_bytes < rows["none"].pte_bytes


class _FlagCond(torch.nn.Module):
    """A ``cond`` on a buffer flag: folded before QNN's export passes (the early control-flow
    fold), so the hook's own fold finds nothing left."""

    def __init__(self):
        super().__init__()
        self.register_buffer("flag", torch.ones(1))
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return torch.cond(self.flag.sum() > 0, lambda x: x @ (self.w * 2).t(), lambda x: x + self.w.exp().sum(0), (x,))


def test_a_row_folded_before_the_export_passes_is_not_called_a_fold_with_nothing_to_do():
    module, inputs = _FlagCond().eval(), _x(4, 16)
    (on,) = qnn_rows.lower_rows("flag_cond", module, inputs, "fp16", modes=("on",))
    row = Row("flag_cond", "fold_constants", "qnn", precision="fp16")
    qnn_unit.fill_row(row, on)
    assert row.status == "ok", row.traceback
    assert on.folds_changed_program and row.note is None, (on.folds_changed_program, row.note)


class _ExportsOtherCode(torch.nn.Module):
    """Eager computes ``relu(proj(x) + proj(table)) * 1.1``; the exported program, and so the
    ``.pte``, leaves out the ``* 1.1`` (`torch.compiler.is_exporting`): a deliberately wrong HTP
    output, 10 % of the scale away from eager, on the real backend."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.register_buffer("table", torch.randn(4, 16, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        y = torch.relu(self.proj(x) + self.proj(self.table))
        return y if torch.compiler.is_exporting() else y * 1.1


def test_a_wrong_htp_output_is_a_mismatch_in_the_row_the_table_and_the_json(tmp_path):
    module, inputs = _ExportsOtherCode().eval(), _x(4, 16)
    rows = qnn_rows.lower_rows("exports_other_code", module, inputs, "fp16", modes=("off", "on"))
    dicts = []
    for variant, q in zip(("none", "fold_constants"), rows):
        assert q.pte_bytes and q.htp_run_ms > 0, q.traceback  # it lowered and ran
        assert q.htp_max_abs_diff > 0.05 * q.output_scale  # the missing * 1.1
        assert q.status.startswith("mismatch: max abs diff vs eager"), q.status
        row = Row("exports_other_code", variant, "qnn", precision="fp16")
        qnn_unit.fill_row(row, q)
        dicts.append(row.to_dict())
    # both are equally wrong: the fold-on row is within fp16's tolerance of the fold-off row
    assert rows[1].htp_vs_off_max_abs_diff <= rows[1].tolerance
    paths = report.write_all(dicts, str(tmp_path), {"command": "test"})
    assert all(r["status"].startswith("mismatch") for r in json.loads(open(paths["json"]).read())["rows"])
    assert "| exports_other_code | fold_constants | qnn | fp16 | mismatch: max abs diff vs eager" in open(paths["md"]).read()


def test_a_fold_on_output_away_from_fold_off_is_a_mismatch():
    """The fold-on ``.pte`` run on the real HTP, compared with its true fold-off output and with
    one moved by 5 % of the scale (fp16's tolerance is 1 %)."""
    module, inputs = SkipIdShift().eval(), _x(4, 16)
    with torch.no_grad():
        expected = [module(*inputs)]
    buffers = {fold: lower_with_wrapper(module, inputs, compiler_specs(fold)).to_executorch().buffer
               for fold in (False, True)}
    (off_out,) = qnn.run_pte(buffers[False], inputs)
    row = qnn_rows.QnnRow("skip_id_shift", "fp16", "on")
    qnn_rows._run_on_htp(row, buffers[True], inputs, expected, [off_out])
    assert row.status == "ok" and row.htp_vs_off_max_abs_diff <= row.tolerance
    moved = off_out + 0.05 * row.output_scale
    row = qnn_rows.QnnRow("skip_id_shift", "fp16", "on")
    qnn_rows._run_on_htp(row, buffers[True], inputs, expected, [moved])
    assert row.status.startswith("mismatch: max abs diff vs fold off on HTP"), row.status
    assert row.htp_vs_off_max_abs_diff > row.tolerance >= row.htp_max_abs_diff
