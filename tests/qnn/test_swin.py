"""swin_v2_t (torchvision, random weights: nothing is downloaded) in 8a8w with QnnQuantizer:
with folding, HTP lowering leaves nothing but I/O on the CPU. Slow: 8m46s on 2 cores
(quantization ~2 min, lowering ~7 min), 1.6 GB peak memory."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

import qnn

from .helpers import (
    assert_kept_whole_ops_gone,
    assert_no_static_partition,
    compiler_specs,
    lower_with_wrapper,
    partitioner_of,
    quantize,
)


@pytest.mark.slow
def test_swin_v2_t_8a8w_leaves_only_io_on_cpu():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.swin_v2_t().eval()
    inputs = (torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),)
    converted = quantize(model, inputs, QuantDtype.use_8a8w)

    manager = lower_with_wrapper(converted, inputs, compiler_specs(True, quantized=True))
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    assert not report.decomposed
    assert report.fold_report.folded  # shifted-window masks and position-bias tables
    summary = qnn.describe_partitions(manager)
    assert summary.partitions >= 1
    assert summary.cpu_ops == {}, summary.cpu_ops
    graph = manager.exported_program().graph
    ops = {n.op for n in graph.nodes}
    assert ops <= {"placeholder", "get_attr", "call_function", "output"}
    calls = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert calls <= {"executorch_call_delegate", "<built-in function getitem>"}, calls
