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
from folding import Reason

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
    partitioner = partitioner_of(manager)
    report = partitioner.reports[-1]
    # the fold that removed the cond before QNN's export pipeline is reported, not dropped
    (early, *_) = partitioner.fold_reports
    assert any(d.reason is Reason.INLINED and d.target == "higher_order.cond" for d in early.decisions)
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


# -- where executorch 1.5.1 stops a runtime-predicate cond on QNN ---------------------------
# executorch PR 22252 ("skip higher-order ops in LiftConstantScalarOperands") has this shape: a
# variant of the pass that leaves higher-order ops alone. With it, QNN's export pipeline passes
# a runtime cond; the to-edge pass I64toI32 then fails on the cond's body get_attr (no
# meta["val"], builders/utils.py is_constant). The test pins both and passes (strict xfail
# turns into a failure) once executorch lowers the cond with its bodies on the CPU.


def _hop_aware_pass_manager():
    from types import BuiltinFunctionType, BuiltinMethodType

    from executorch.backends.qualcomm._passes.lift_constant_scalar_operands import (
        SKIP_LIFT_OPS,
        LiftConstantScalarOperands,
    )
    from executorch.backends.qualcomm._passes.qnn_pass_manager import get_qnn_pass_manager_cls

    class SkipHigherOrderOps(LiftConstantScalarOperands):
        def _lift(self, gm):
            for n in gm.graph.nodes:
                if (n.op != "call_function" or n.target in SKIP_LIFT_OPS or isinstance(
                        n.target, (BuiltinMethodType, BuiltinFunctionType, torch._ops.HigherOrderOperator))):
                    continue
                if tensor_args := self._create_tensor_args(n, gm):
                    self._update_node(n, tensor_args)

    def swap(p):
        return SkipHigherOrderOps if p is LiftConstantScalarOperands else p

    base = get_qnn_pass_manager_cls()

    class HopAware(base):
        @classmethod
        def get_export_passes(cls):
            return [swap(p) for p in super().get_export_passes()]

        @classmethod
        def get_default_pass_activations(cls):
            return [(swap(p), on) for p, on in super().get_default_pass_activations()]

        @classmethod
        def get_passes_dependency_for_capture_program(cls):
            return {swap(k): [swap(v) for v in vs] for k, vs in super().get_passes_dependency_for_capture_program().items()}

    return HopAware


def test_upstream_lift_fix_lets_the_export_pipeline_pass_a_runtime_cond():
    ep = torch.export.export(LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),), strict=True)
    ep = _hop_aware_pass_manager()().transform_for_export_pipeline(ep)
    assert any(n.target is torch.ops.higher_order.cond for n in ep.graph.nodes)


def _lower_runtime_cond_with_the_upstream_lift_fix():
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    from executorch.exir import to_edge_transform_and_lower

    module, inputs = LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),)
    manager_cls = _hop_aware_pass_manager()
    ep = manager_cls().transform_for_export_pipeline(torch.export.export(module, inputs, strict=True))
    partitioner = qnn.QnnPartitioner(compiler_specs(False), to_edge_passes=lambda p: manager_cls().get_to_edge_transform_passes(p))
    manager = to_edge_transform_and_lower(ep, transform_passes=partitioner.to_edge_passes(ep),
                                          partitioner=[partitioner], compile_config=qnn_edge_config())
    return manager, module, inputs


def test_with_the_upstream_lift_fix_i64toi32_is_where_a_runtime_cond_stops():
    with pytest.raises(Exception, match="'I64toI32' pass") as error:
        _lower_runtime_cond_with_the_upstream_lift_fix()
    assert isinstance(error.value.__cause__, KeyError) and error.value.__cause__.args == ("val",)


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="executorch 1.5.1: I64toI32 reads meta['val'] of a control-flow body's get_attr")
def test_runtime_cond_lowers_with_its_bodies_on_the_cpu_once_upstream_allows():
    from .helpers import assert_runs_on_htp

    manager, module, inputs = _lower_runtime_cond_with_the_upstream_lift_fix()
    assert qnn.describe_partitions(manager).partitions >= 1
    assert_runs_on_htp(manager, module, inputs)
    assert_runs_on_htp(manager, module, (-inputs[0],))


def test_quantizing_a_runtime_cond_stops_with_the_typed_error():
    """QnnQuantizer's annotation pipeline runs LiftConstantScalarOperands too: the benchmark's
    quantization (and any caller of `qnn.control_flow.require_no_control_flow`) stops first."""
    from benchmarks.qnn_rows import quantize_for_htp

    with pytest.raises(qnn.ControlFlowNotSupportedError, match="QnnQuantizer's annotation pipeline"):
        quantize_for_htp(LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),), "8a8w")
