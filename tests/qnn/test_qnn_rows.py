"""The QNN benchmark rows (benchmarks/qnn_rows.py) on tiny models, with the SDK stand-in."""

from __future__ import annotations

import json

import torch

import qnn
from benchmarks import qnn_rows

from .helpers import STRANDED, compiler_specs, lower_with_wrapper
from .models import RELU, LinearCutOffByRelu, SkipIdShift


def _x(*shape):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(11)),)


def test_fold_off_row_reports_stranded_op_and_fold_on_row_delegates(tmp_path):
    off, on = qnn_rows.lower_rows("linear_cut_off", LinearCutOffByRelu().eval(), _x(4, 64), "fp16",
                                  skip_node_op_set={RELU})
    assert (off.fold, on.fold) == (False, True)
    assert off.status.startswith("error (lower): RuntimeError: ") and STRANDED in off.status
    assert off.partitions is None and off.fold_time_s is None and "Traceback" in off.traceback

    assert on.status == "ok", on.traceback
    assert on.partitions == 1 and on.refused_partitions == 0 and on.static_partitions == 0
    assert on.cpu_ops == {} and on.cpu_op_count == 0
    # proj weight and bias, and the folded relu(linear(table, weight)): 4x64 fp32
    assert on.constant_bytes_in_partitions == (64 * 64 + 64 + 4 * 64) * 4
    assert on.constant_bytes_on_cpu == 0
    assert on.fold_time_s > 0 and on.lower_time_s > 0 and on.wall_time_s >= on.fold_time_s + on.lower_time_s
    assert on.pte == qnn_rows.NO_SDK_PTE and on.pte_bytes is None

    rows = [off.to_dict(), on.to_dict()]
    table = qnn_rows.to_markdown(rows)
    assert qnn_rows.NO_SDK_HEADER in table
    lines = table.splitlines()
    assert lines[-1].startswith("| linear_cut_off | fp16 | on | ok | 1 | 0 | 17,664 | 0 | ")
    assert lines[-1].endswith(f" | {qnn_rows.NO_SDK_PTE} |")
    assert STRANDED in lines[-2]
    paths = qnn_rows.write_all(rows, str(tmp_path), {"command": "test"})
    assert json.loads(open(paths["json"]).read())["rows"][1]["constant_bytes_in_partitions"] == 17664
    assert "## Errors" in open(paths["md"]).read()


def test_rows_agree_with_describe_partitions():
    """Nothing skipped: both settings lower, and each row is what `qnn.describe_partitions` says
    of the same lowering. Without folding the constant branch joins the runtime one through the
    add, so its 4x16 table and 16x16 weight enter the partition; with folding its 4x16 result does."""
    module, inputs = SkipIdShift().eval(), _x(4, 16)
    off, on = qnn_rows.lower_rows("skip_id_shift", module, inputs, "fp16")
    for row in (off, on):
        assert row.status == "ok", row.traceback
        want = qnn.describe_partitions(lower_with_wrapper(module, inputs, compiler_specs(row.fold)))
        assert row.partitions == want.partitions >= 1
        assert row.cpu_ops == want.cpu_ops
        assert row.constant_bytes_in_partitions == want.constant_bytes_in_partitions
        assert row.constant_bytes_on_cpu == want.constant_bytes_on_cpu
        assert row.static_partitions == 0 and row.refused_partitions == 0
    # fp32: proj weight and bias, plus the scalars of the muls QNN lifts to 1-element tensors,
    # each buffer padded to 16 bytes as the .pte stores it (folding.sizes.aligned)
    from folding.sizes import aligned

    proj, scalar = aligned(16 * 16 * 4) + aligned(16 * 4), aligned(4)
    assert off.constant_bytes_in_partitions == proj + aligned(4 * 16 * 4) + aligned(16 * 16 * 4) + 2 * scalar
    assert on.constant_bytes_in_partitions == proj + aligned(4 * 16 * 4) + scalar
    assert off.cpu_ops == on.cpu_ops == {}
    assert off.fold_time_s is None and on.fold_time_s > 0
