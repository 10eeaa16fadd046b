"""With the real Qualcomm SDK (QNN_SDK_ROOT set): HTP itself refuses a constant-only partition,
and folding makes the same program lower.

Lowered through executorch's stock ``QnnPartitioner`` (partition/qnn_partitioner.py), which has
no rule about partitions without a runtime input, so our mirror of HTP's refusal (qnn/htp_rule.py)
is not in play: what refuses the fold-off program is the SDK (op validation or the context compile
in preprocess). Without folding that partitioner hands HTP a partition fed only by constants
(`delegates_without_runtime_input`; checked without the SDK, with the stand-in, in
test_partitioner.py::test_stock_partitioner_delegates_constant_only_partition). With folding
(`folding.fold_constants` after QNN's export passes) no such partition exists and the program
lowers and serialises.

Every test here is marked ``qnn_sdk`` and skipped when ``QNN_SDK_ROOT`` is unset (conftest.py).
"""

from __future__ import annotations

import pytest

import qnn

from .helpers import (
    assert_kept_whole_ops_gone,
    assert_no_static_partition,
    compiler_specs,
    delegates_without_runtime_input,
    lower_executorch_stock,
    lower_with_wrapper,
    partitioner_of,
)
from .models import CASES

pytestmark = pytest.mark.qnn_sdk

REAL = ["linear_cut_off_by_relu", "rms_norm_of_parameter", "pixel_unshuffle_of_constant"]


@pytest.mark.parametrize("name", REAL)
def test_htp_refuses_constant_only_partition_fold_off(name):
    """Fold off, executorch's partitioner: HTP itself refuses (no rule of ours runs)."""
    case = CASES[name]
    with pytest.raises((RuntimeError, AssertionError)) as error:
        manager = lower_executorch_stock(case.make().eval(), case.inputs(), case.skip_ops, fold=False)
        manager.to_executorch()
    print(f"HTP's refusal of {name} without folding: {type(error.value).__name__}: {error.value}")


@pytest.mark.parametrize("name", REAL)
def test_htp_lowers_folded_program_with_stock_partitioner(name):
    """Fold on, the same executorch partitioner: HTP compiles every partition."""
    case = CASES[name]
    manager = lower_executorch_stock(case.make().eval(), case.inputs(), case.skip_ops, fold=True)
    assert delegates_without_runtime_input(manager) == []
    summary = qnn.describe_partitions(manager)
    assert summary.partitions >= 1 and summary.cpu_ops == {}, summary
    assert_kept_whole_ops_gone(manager)
    assert len(manager.to_executorch().buffer) > 0


@pytest.mark.parametrize("name", REAL)
def test_real_sdk_wrapper_fold_on_lowers_and_serialises(name):
    """Our wrapper and `qnn.QnnPartitioner` with the ``fold_constants`` spec, on the real SDK."""
    case = CASES[name]
    manager = lower_with_wrapper(case.make().eval(), case.inputs(), compiler_specs(True), case.skip_ops)
    assert_no_static_partition(partitioner_of(manager).reports[-1])
    assert_kept_whole_ops_gone(manager)
    assert len(manager.to_executorch().buffer) > 0
