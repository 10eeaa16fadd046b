"""Control flow on the QNN path, on the real HTP backend.

executorch 1.5.1's QNN passes ``LiftConstantScalarOperands`` and ``I64toI32`` crash on every
higher-order op (pinned below, so a fixed executorch shows up here); `qnn.pass_manager_cls`
replaces both with variants that leave control flow alone. With ``fold_constants`` on, the
upstream review's two cases lower when the cond's predicate is constant (the cond is inlined
and its constant-only kept-whole ops folded); with a runtime predicate the cond and its bodies
stay on the CPU and the rest is delegated, fold on or off. QNN's quantizer still stops on
control flow, with `qnn.ControlFlowNotSupportedError`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
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


def _ops_on_cpu(manager) -> set[str]:
    return set(qnn.describe_partitions(manager).cpu_ops)


def _flipped(inputs):
    return tuple(-t for t in inputs)


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_a_runtime_cond_stays_on_the_cpu_and_the_rest_runs_on_htp(case, fold):
    """executorch 1.5.1's QNN passes crash on a cond (pinned below); `qnn.control_flow`'s
    variants leave it alone, so the cond and its bodies run on the CPU and the code around it
    is delegated. Both branches are taken on the emulated HTP."""
    module, inputs = case(constant_predicate=False).eval(), (torch.randn(8, 8).abs(),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(fold))
    assert "higher_order.cond" in _ops_on_cpu(manager)
    assert qnn.describe_partitions(manager).partitions >= 1
    assert_kept_whole_ops_gone(manager)  # a body's kept-whole op is decomposed, not stranded
    if fold:
        assert_no_static_partition(partitioner_of(manager).reports[-1])
    assert_runs_on_htp(manager, module, inputs, more_inputs=[_flipped(inputs)])


def test_a_runtime_cond_lowers_in_the_stock_flow_with_the_control_flow_pass_manager():
    """executorch's own ``to_edge_transform_and_lower`` with `qnn.QnnPartitioner`: the caller
    builds QNN's pipelines from `qnn.pass_manager_cls()` instead of ``QnnPassManager``."""
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    from executorch.exir import to_edge_transform_and_lower

    module, inputs = LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8).abs(),)
    ep = qnn.pass_manager_cls()().transform_for_export_pipeline(torch.export.export(module, inputs, strict=True))
    partitioner = qnn.QnnPartitioner(compiler_specs(True))
    manager = to_edge_transform_and_lower(ep, transform_passes=partitioner.default_to_edge_passes(ep),
                                          partitioner=[partitioner], compile_config=qnn_edge_config())
    assert "higher_order.cond" in _ops_on_cpu(manager)
    assert_kept_whole_ops_gone(manager)
    assert_runs_on_htp(manager, module, inputs, more_inputs=[_flipped(inputs)])


class LinearThenMap(nn.Module):
    """A parameter read by a delegated linear and by a map on the CPU (executorch 1.5.1's
    ``tag_constant_data`` tagged it for the delegate, and ``to_backend`` refused the program)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)

    def forward(self, x):
        return hop_map(lambda xi, w: torch.relu(xi @ w), F.linear(x, self.w), self.w) + 1.0


class LinearThenScan(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)

    def forward(self, x):
        def combine(carry, xi):
            carry = carry + xi
            return carry, carry.clone()

        return scan(combine, torch.zeros(8), F.linear(x, self.w))[1] * 2.0


class LinearInRegion(nn.Module):
    def __init__(self, region: str):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.region = region

    def forward(self, x):
        y = F.linear(x, self.w)
        with torch.no_grad() if self.region == "no_grad" else torch.autocast("cpu", enabled=False):
            z = torch.relu(y) * 2.0
        return z + y


class ParameterReadAndReturned(nn.Module):
    """A parameter read by a delegated linear and returned as an output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 8))
        self.p = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.b + self.b, self.p), self.p


OTHER_CASES = {
    "map": LinearThenMap,
    "scan": LinearThenScan,
    "no_grad": lambda: LinearInRegion("no_grad"),
    "autocast": lambda: LinearInRegion("autocast"),
    "parameter_returned": ParameterReadAndReturned,
}
_SCAN_FOLD_OFF = pytest.mark.xfail(
    strict=True, raises=RuntimeError,
    reason="fold off: the delegate before the scan computes its zeros carry (aten.full, no input) as a "
           "graph output, and the emulated HTP fails CALL_DELEGATE (0x1); folded, the carry is a constant")


@pytest.mark.parametrize("fold", [True, pytest.param(False, id="False")])
@pytest.mark.parametrize("name", sorted(OTHER_CASES))
def test_other_control_flow_and_shared_constants_lower_and_run_on_htp(name, fold, request):
    if name == "scan" and not fold:
        request.applymarker(_SCAN_FOLD_OFF)
    module, inputs = OTHER_CASES[name]().eval(), (torch.randn(8, 8),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(fold))
    assert qnn.describe_partitions(manager).partitions >= 1
    assert_kept_whole_ops_gone(manager)
    assert_runs_on_htp(manager, module, inputs, more_inputs=[_flipped(inputs)])


def test_a_while_loop_lowers_and_the_emitter_refuses_it_as_on_every_backend():
    """QNN lowering keeps a while_loop on the CPU; executorch 1.5.1's emitter has no while_loop
    (exir/emit/_emitter.py), on any backend. This starts failing once it has one."""
    from torch._higher_order_ops.while_loop import while_loop

    class HalveThrice(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8) / 4)

        def forward(self, x):
            y = F.linear(x, self.w)
            return while_loop(lambda i, z: i < 3, lambda i, z: (i + 1, z * 0.5), (torch.tensor(0), y))[1] + 1.0

    manager = lower_with_wrapper(HalveThrice().eval(), (torch.randn(8, 8),), compiler_specs(True))
    assert "higher_order.while_loop" in _ops_on_cpu(manager)
    with pytest.raises(Exception, match="Unsupported control flow operator: while_loop"):
        manager.to_executorch()


def test_a_callers_passes_job_and_dep_table_get_the_control_flow_variants():
    """`to_edge_transform_and_lower_to_qnn(..., passes_job=..., dep_table=...)` takes executorch's
    tables, keyed by its pass classes; the lowering swaps in the variants."""
    from executorch.backends.qualcomm._passes.i64_to_i32 import I64toI32
    from executorch.backends.qualcomm._passes.lift_constant_scalar_operands import LiftConstantScalarOperands

    from qnn._passes import I64toI32SkippingBodies, LiftScalarOperandsSkippingControlFlow
    from qnn.pass_manager import with_control_flow_passes

    job = with_control_flow_passes(QnnPassManager.get_capture_program_passes())
    deps = with_control_flow_passes(QnnPassManager.get_passes_dependency_for_capture_program())
    assert I64toI32 not in job and I64toI32SkippingBodies in job
    assert list(job) == [I64toI32SkippingBodies if p is I64toI32 else p for p in QnnPassManager.get_capture_program_passes()]
    assert deps[I64toI32SkippingBodies] == [LiftScalarOperandsSkippingControlFlow if p is LiftConstantScalarOperands else p
                                           for p in QnnPassManager.get_passes_dependency_for_capture_program()[I64toI32]]
    assert with_control_flow_passes(None) is None


def test_upstream_export_pipeline_still_crashes_on_cond():
    """Why `qnn._passes.LiftScalarOperandsSkippingControlFlow` exists: QNN's own export
    passes on a cond (no fold). This starts failing once executorch skips higher-order ops."""
    ep = torch.export.export(LinearFeedsCond(constant_predicate=True).eval(), (torch.randn(8, 8),), strict=True)
    with pytest.raises(Exception, match="LiftConstantScalarOperands") as error:
        QnnPassManager().transform_for_export_pipeline(ep)
    assert "_schema" in repr(error.value.__cause__ or error.value) or "_schema" in str(error.value)


def test_upstream_i64toi32_still_crashes_on_a_body():
    """Why `qnn._passes.I64toI32SkippingBodies` exists: QNN's own I64toI32 on an Edge
    program with a cond reads ``meta["val"]`` of the body's get_attr. This starts failing once
    executorch's pass leaves bodies alone."""
    from executorch.backends.qualcomm._passes.i64_to_i32 import I64toI32
    from executorch.exir import to_edge

    module, inputs = LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),)
    ep = qnn.pass_manager_cls()().transform_for_export_pipeline(torch.export.export(module, inputs, strict=True))
    edge = to_edge(ep).exported_program()
    with pytest.raises(KeyError, match="val"):
        I64toI32(edge)(edge.graph_module)
    qnn._passes.I64toI32SkippingBodies(edge)(edge.graph_module)  # the variant passes


def test_executorchs_quantizer_fails_on_a_cond_and_the_check_before_it_names_the_node():
    """README: executorch's QnnQuantizer fails inside executorch on a higher-order op;
    `require_no_control_flow`, called first, raises the typed error naming the node."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    program = torch.export.export(LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),))
    with pytest.raises(qnn.ControlFlowNotSupportedError, match="node 'cond'"):
        qnn.control_flow.require_no_control_flow(program)
    with pytest.raises(Exception, match="LiftConstantScalarOperands") as raised:
        prepare_pt2e(program.module(), QnnQuantizer())
    assert isinstance(raised.value.__cause__, AttributeError), raised.value.__cause__


def test_quantizing_a_runtime_cond_stops_with_the_typed_error():
    """QnnQuantizer's annotation pipeline runs LiftConstantScalarOperands too: the benchmark's
    quantization (and any caller of `qnn.control_flow.require_no_control_flow`) stops first."""
    from benchmarks.qnn_rows import quantize_for_htp

    with pytest.raises(qnn.ControlFlowNotSupportedError, match="QnnQuantizer's annotation pipeline"):
        quantize_for_htp(LinearFeedsCond(constant_predicate=False).eval(), (torch.randn(8, 8),), "8a8w")


class CondThenMap(nn.Module):
    """Issue 33's program, shrunk from a fuzz campaign: a cond whose result a later ``map`` could
    overwrite in the arena every control-flow body shares (executorch issue 21490). Folded and
    lowered with a plain ``to_executorch()``, output ``c`` was off by about 2 on both branches."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(26)
        self.register_buffer("b2", torch.randn(4, generator=g))
        self.p26 = nn.Parameter(torch.randn(4, 4, generator=g))

    def forward(self, x):
        def t(a):
            return ((torch.arange(16.0).reshape(4, 4) * 0.1).index_select(1, torch.roll(torch.arange(4), 1)),)

        def f(a):
            return (a @ (torch.ones(4, 4) * 0.5),)

        (c,) = torch.cond(x[:, 0].sum() > 0, t, f, (x,))
        m = hop_map(lambda xi, q: self.p26.sum(0), x, torch.arange(4))
        return torch.ones(4, 4) + self.b2, c, m


@pytest.mark.parametrize("fold", [
    pytest.param(False, id="fold_off", marks=pytest.mark.xfail(strict=True, reason=(
        "another fault, fold off only: the delegate before the cond computes arange(4) (no "
        "input) as a partition output; HTP does not bind an output computed from static tensors "
        "only ('binds 2 tensors ... ExecuTorch passed 3 arguments', CALL_DELEGATE 0x1), as "
        "with scan's zeros carry (_SCAN_FOLD_OFF above). With the "
        "copy removed it fails the same way."))),
    pytest.param(True, id="fold_on"),
])
def test_control_flow_outputs_are_right_through_the_wrappers_plain_to_executorch(fold):
    """`qnn.to_edge_transform_and_lower_to_qnn` copies control-flow outputs out of the body arena
    (`folding.copy_control_flow_outputs`): the caller's plain ``to_executorch()`` (inside
    `assert_runs_on_htp`) gives a .pte that is right on inputs taking each branch."""
    module = CondThenMap().eval()
    ones = torch.ones(4, 4)
    manager = lower_with_wrapper(module, (ones,), compiler_specs(fold))
    graph = manager.exported_program().graph
    calls = [n for n in graph.nodes if n.target in (torch.ops.higher_order.cond, torch.ops.higher_order.map_impl)]
    assert len(calls) == 2
    for item in (u for call in calls for u in call.users):
        assert [u.target.__name__ for u in item.users] in (["aten.clone.default"], ["dim_order_ops._clone_dim_order.default"]), item.users
    assert_runs_on_htp(manager, module, (ones,), more_inputs=[(-ones,)])
