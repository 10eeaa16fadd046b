"""QnnPartitioner beyond the acceptance cases: backends, declined folds, skip ids, summaries."""

from __future__ import annotations

import pytest
import torch

import qnn
from folding import FoldPolicy, Reason

from .helpers import (
    STRANDED,
    assert_kept_whole_ops_gone,
    compiler_specs,
    delegates_without_runtime_input,
    lower_executorch_stock,
    lower_with_wrapper,
    partitioner_of,
)
from .models import CASES, RELU, LinearCutOffByRelu, SkipIdShift


def _x(*shape):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(11)),)


def test_gpu_accepts_partitions_without_runtime_input(qnn_gpu_stand_in):
    """The HTP rule is HTP's: on GPU the constant linear's partition is delegated as is."""
    manager = lower_with_wrapper(LinearCutOffByRelu().eval(), _x(4, 64), compiler_specs(False, backend="gpu"), {RELU})
    report = partitioner_of(manager).reports[-1]
    assert report.backend == "kGpuBackend"
    assert not report.refused
    static = [p for p in report.delegated if not p.runtime_inputs]
    assert len(static) == 1 and "aten_linear_default" in static[0].nodes
    assert static[0].static_input_bytes == (4 * 64 + 64 * 64) * 4
    assert_kept_whole_ops_gone(manager)


def test_stock_partitioner_hands_htp_a_constant_only_partition():
    """Executorch's own partitioner has no HTP input rule: without folding it hands HTP the
    partition fed only by constants, and HTP's context compile refuses it ("No graph inputs
    present", 0x7532); with folding there is no such partition and the program compiles."""
    case = CASES["linear_cut_off_by_relu"]
    with pytest.raises(AssertionError, match="Failed to generate Qnn context binary"):
        lower_executorch_stock(case.make().eval(), case.inputs(), case.skip_ops, fold=False)
    manager = lower_executorch_stock(case.make().eval(), case.inputs(), case.skip_ops, fold=True)
    assert delegates_without_runtime_input(manager) == []
    assert qnn.describe_partitions(manager).partitions == 1


def test_declined_kept_whole_op_is_decomposed_and_reported():
    """A size policy that declines the constant linear (its 1 KiB result is over the cap):
    the linear is decomposed instead of kept whole, so it cannot reach the CPU undecomposed."""
    policy = FoldPolicy(max_tensor_bytes=512)
    manager = lower_with_wrapper(LinearCutOffByRelu().eval(), _x(4, 64), compiler_specs(True, policy=policy), {RELU})
    report = partitioner_of(manager).reports[-1]
    assert [(d.node, d.target, d.reason) for d in report.decomposed] == [
        ("linear", "aten.linear.default", Reason.MAX_TENSOR_BYTES)
    ]
    assert_kept_whole_ops_gone(manager)
    cpu = qnn.describe_partitions(manager).cpu_ops
    assert "aten.linear.default" not in cpu and cpu  # its decomposition runs on the CPU
    assert report.refused  # the decomposed constant ops form a static partition HTP refuses
    assert all(not p.runtime_inputs for p in report.refused)


def test_declined_without_fold_stage_still_fails():
    """Nothing is decomposed when folding is off: the failure is the HTP rule's."""
    with pytest.raises(RuntimeError, match=STRANDED):
        lower_with_wrapper(LinearCutOffByRelu().eval(), _x(4, 64), compiler_specs(False), {RELU})


@pytest.mark.parametrize("fold", [False, True])
def test_skip_node_id_set_names_the_same_node(fold):
    """Without folding, ``aten_mul_tensor_1`` is the runtime mul (the constant one is
    ``aten_mul_tensor``). With folding the constant mul is gone, and the name still means the
    runtime mul, which therefore stays on the CPU. (Here the constant linear shares a partition
    with the runtime ``proj``, so even without folding nothing is stranded.)"""
    manager = lower_with_wrapper(SkipIdShift().eval(), _x(4, 16), compiler_specs(fold), {RELU},
                                 skip_ids={"aten_mul_tensor_1"})
    report = partitioner_of(manager).reports[-1]
    assert report.nodes["aten_mul_tensor_1"][1][0] == "aten_sigmoid_default"  # reads sigmoid(proj(x))
    cpu = [n.name for n in manager.exported_program().graph.nodes
           if n.op == "call_function" and n.name.startswith("aten_")]
    assert sorted(cpu) == (["aten_mul_tensor_1"] if fold else ["aten_mul_tensor_1", "aten_relu_default"])
    assert all(p.runtime_inputs for p in report.partitions)
    if fold:
        assert report.renamed.get("aten_mul_tensor") == "aten_mul_tensor_1"
    else:
        mixed = [p for p in report.delegated if "aten_linear_default" in p.nodes]
        assert "aten_linear_default_1" in mixed[0].nodes  # the constant linear rides along


def test_describe_partitions_counts():
    manager = lower_with_wrapper(LinearCutOffByRelu().eval(), _x(4, 64), compiler_specs(True), {RELU})
    summary = qnn.describe_partitions(manager)
    assert summary.partitions == 1
    assert summary.cpu_ops == {} and summary.cpu_op_count == 0
    # the proj weight and bias, and the folded relu(linear(table, weight)): 4x64 fp32
    assert summary.constant_bytes_in_partitions == (64 * 64 + 64 + 4 * 64) * 4
    assert summary.constant_bytes_on_cpu == 0
    assert qnn.describe_partitions(manager.exported_program()) == summary


def test_lowering_is_deterministic():
    """The same model lowers to the same .pte, but for the HTP context binaries: QNN writes ids
    that differ per compile into them (hundreds of bytes at fixed offsets), so the delegate
    payloads are compared by size and the rest of the .pte byte for byte."""
    managers = [lower_with_wrapper(SkipIdShift().eval(), _x(4, 16), compiler_specs(True), {RELU}) for _ in range(2)]
    masked = []
    for manager in managers:
        buffer = bytearray(manager.to_executorch().buffer)
        payloads = [m.processed_bytes for _, m in manager.exported_program().graph_module.named_children()
                    if hasattr(m, "processed_bytes")]
        assert payloads
        for payload in payloads:
            at = bytes(buffer).find(payload)
            assert at >= 0 and bytes(buffer).find(payload, at + 1) < 0
            buffer[at:at + len(payload)] = bytes(len(payload))
        masked.append((bytes(buffer), [len(p) for p in payloads]))
    assert masked[0] == masked[1]
    assert managers[0].exported_program().graph_module.code == managers[1].exported_program().graph_module.code


def test_names_are_restored_only_when_they_matter():
    """Default: to_edge's names unless a skip_node_id_set depends on them (restoring costs a
    second to_edge of the unfolded program); preserve_edge_names=True always restores."""
    auto = lower_with_wrapper(SkipIdShift().eval(), _x(4, 16), compiler_specs(True), {RELU})
    report = partitioner_of(auto).reports[-1]
    assert report.renamed == {} and "aten_mul_tensor" in report.nodes  # shifted from _1
    always = lower_with_wrapper(SkipIdShift().eval(), _x(4, 16), compiler_specs(True), {RELU}, preserve_names=True)
    assert partitioner_of(always).reports[-1].renamed["aten_mul_tensor"] == "aten_mul_tensor_1"


def test_renamed_graph_output_keeps_a_valid_signature():
    from .models import RenamedOutput

    module, inputs = RenamedOutput().eval(), _x(4, 16)
    manager = lower_with_wrapper(module, inputs, compiler_specs(True), {RELU}, preserve_names=True)
    report = partitioner_of(manager).reports[-1]
    assert report.renamed.get("aten_mul_tensor_1") == "aten_mul_tensor_2"  # the second output
    manager.exported_program().validate()
    assert len(manager.exported_program().graph_signature.user_outputs) == 2
