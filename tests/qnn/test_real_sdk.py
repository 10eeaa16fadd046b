"""With the real Qualcomm SDK (QNN_SDK_ROOT set): the same lowering, no stand-in."""

from __future__ import annotations

import pytest

from .helpers import STRANDED, assert_kept_whole_ops_gone, assert_no_static_partition, compiler_specs, \
    lower_with_wrapper, partitioner_of
from .models import CASES

REAL = ["linear_cut_off_by_relu", "rms_norm_of_parameter", "pixel_unshuffle_of_constant"]


@pytest.mark.qnn_sdk
@pytest.mark.parametrize("name", REAL)
def test_real_sdk_fold_on_lowers_and_serialises(name):
    case = CASES[name]
    manager = lower_with_wrapper(case.make().eval(), case.inputs(), compiler_specs(True), case.skip_ops)
    assert_no_static_partition(partitioner_of(manager).reports[-1])
    assert_kept_whole_ops_gone(manager)
    assert len(manager.to_executorch().buffer) > 0


@pytest.mark.qnn_sdk
@pytest.mark.parametrize("name", REAL)
def test_real_sdk_fold_off_strands(name):
    case = CASES[name]
    with pytest.raises(RuntimeError, match=STRANDED):
        lower_with_wrapper(case.make().eval(), case.inputs(), compiler_specs(False), case.skip_ops)
