"""A two-stage Swin v2 (torchvision's ``swin_v2_t`` blocks, patch merging, shifted windows and
continuous position bias, with depths 2+2 instead of 2+2+6+2; random weights, nothing is
downloaded) in 8a8w with QnnQuantizer: with folding, every partition has a runtime input and what stays on the CPU is what real HTP's
op validation refuses: the 6-D reshapes and permutes of the window partition (QNN 2.49 HTP
validates ``Reshape``/``Transpose`` up to rank 5 here). The .pte runs on the emulated HTP
within the quantization error of the converted program. The whole ``swin_v2_t`` goes the same
way in the main job's QNN 8a8w row (``python -m benchmarks``); its lowering takes over two
minutes here, this one under one. Slow: QNN op validation of ~1,000 quantized nodes."""

from __future__ import annotations

import pytest
import torch
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

import qnn
from folding.core.ops import op_name

from .helpers import (
    assert_kept_whole_ops_gone,
    assert_no_static_partition,
    compiler_specs,
    lower_with_wrapper,
    partitioner_of,
    quantize,
)


@pytest.mark.slow
def test_swin_v2_8a8w_leaves_only_io_on_cpu():
    swin = pytest.importorskip("torchvision.models.swin_transformer")
    torch.manual_seed(0)
    model = swin.SwinTransformer(patch_size=[4, 4], embed_dim=96, depths=[2, 2], num_heads=[3, 6], window_size=[8, 8],
                                 stochastic_depth_prob=0.0, block=swin.SwinTransformerBlockV2,
                                 downsample_layer=swin.PatchMergingV2).eval()
    # 32x32 and 16x16 feature maps: both stages shift their 8x8 windows
    inputs = (torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(0)),)
    converted = quantize(model, inputs, QuantDtype.use_8a8w)

    manager = lower_with_wrapper(converted, inputs, compiler_specs(True, quantized=True))
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    assert not report.decomposed
    assert report.fold_report.folded  # shifted-window masks and position-bias tables
    summary = qnn.describe_partitions(manager)
    assert summary.partitions >= 1
    graph = manager.exported_program().graph
    cpu = [n for n in graph.nodes if n.op == "call_function" and str(n.target) not in
           ("executorch_call_delegate", "<built-in function getitem>")]
    assert cpu and {op_name(n.target) for n in cpu} <= {"aten.view_copy.default", "aten.permute_copy.default"}, summary
    rank6 = lambda n: any(len(v.shape) == 6 for v in [n.meta["val"]] + [a.meta["val"] for a in n.all_input_nodes])  # noqa: E731
    assert all(rank6(n) for n in cpu), [(n.name, n.meta["val"].shape) for n in cpu if not rank6(n)]
    # 8-bit quantization of a randomly initialised Swin is coarse (the converted q/dq program
    # differs from float by 10 % of the output's scale here: 0.056 at 0.57), and HTP's integer
    # kernels round differently from that simulation. The HTP output must stay within twice the
    # quantization error of both (measured 0.020 from the converted program, 0.054 from float).
    with torch.no_grad():
        want, quantized = model(*inputs), converted(*inputs)
    quantization_error = (quantized - want).abs().max().item()
    (got,) = qnn.run_pte(manager.to_executorch().buffer, inputs)
    assert (got - quantized).abs().max().item() <= 2 * quantization_error
    assert (got - want).abs().max().item() <= 2 * quantization_error
