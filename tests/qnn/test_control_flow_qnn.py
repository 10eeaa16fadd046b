"""Control flow on the QNN path (issue 12), on the real HTP backend.

executorch 1.5.1's QNN pass ``LiftConstantScalarOperands`` crashes on every higher-order op,
in ``transform_for_export_pipeline`` already (pinned below, so a fixed executorch shows up
here). With ``fold_constants`` on, the upstream review's two cases lower when the cond's
predicate is constant (the cond is inlined and its constant-only kept-whole ops folded); with
a runtime predicate the QNN path stops with `qnn.ControlFlowNotSupportedError`, which names
the node and the upstream pass, fold on or off.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager

import qnn

from .helpers import (
    assert_kept_whole_ops_gone,
    assert_no_static_partition,
    assert_runs_on_htp,
    compiler_specs,
    lower_with_wrapper,
    partitioner_of,
)


class LinearFeedsCond(nn.Module):
    """Review case 1: a constant-only linear whose value a top-level cond reads."""

    def __init__(self, constant_predicate: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.register_buffer("flag", torch.tensor(True))
        self.constant_predicate = constant_predicate

    def forward(self, x):
        k = F.linear(self.w, self.w)
        pred = self.flag if self.constant_predicate else x.sum() > 0
        return torch.cond(pred, lambda x, k: (x @ k,), lambda x, k: (x - k,), (x, k))[0]


class KeptWholeInBranch(nn.Module):
    """Review case 2: constant-only kept-whole ops (linear, rms_norm) inside the branches."""

    def __init__(self, constant_predicate: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.g = nn.Parameter(torch.rand(8) + 0.5)
        self.register_buffer("flag", torch.tensor(False))
        self.constant_predicate = constant_predicate

    def forward(self, x):
        pred = self.flag if self.constant_predicate else x.sum() > 0
        return torch.cond(
            pred,
            lambda x, w, g: (x @ F.linear(w, w),),
            lambda x, w, g: (x + F.rms_norm(w, (8,), g),),
            (x, self.w, self.g),
        )[0]


CASES = [LinearFeedsCond, KeptWholeInBranch]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_review_cases_with_a_constant_predicate_lower_with_fold_on(case):
    module, inputs = case(constant_predicate=True).eval(), (torch.randn(8, 8),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(True))
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    program = manager.exported_program()
    assert not [n for n in program.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)
                and n.target is not torch.ops.higher_order.executorch_call_delegate]
    assert_runs_on_htp(manager, module, inputs)


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_runtime_predicate_stops_with_a_typed_error_naming_the_upstream_pass(case, fold):
    with pytest.raises(qnn.ControlFlowNotSupportedError, match="'cond'.*LiftConstantScalarOperands") as error:
        lower_with_wrapper(case(constant_predicate=False).eval(), (torch.randn(8, 8),), compiler_specs(fold))
    assert ("reads runtime values" in str(error.value)) is fold


def test_upstream_export_pipeline_still_crashes_on_cond():
    """The limitation the typed error names: QNN's own export passes on a cond (no fold)."""
    ep = torch.export.export(LinearFeedsCond(constant_predicate=True).eval(), (torch.randn(8, 8),), strict=True)
    with pytest.raises(Exception, match="LiftConstantScalarOperands") as error:
        QnnPassManager().transform_for_export_pipeline(ep)
    assert "_schema" in repr(error.value.__cause__ or error.value) or "_schema" in str(error.value)
