"""Faults outside this project that make HTP's output differ from eager, each as a minimal
reproducer in executorch's own flow (no code of this project on the lowering path; `qnn` only
opens the QNN libraries): each test holds that the fault is still there, so the benchmark's
attribution of a row to it (`benchmarks/htp_faults.py`) cannot outlive it. When one fails,
executorch or QNN fixed the fault: remove it from `benchmarks.htp_faults.KNOWN_FAULTS`."""

from __future__ import annotations

import torch
import torch.nn as nn
from executorch.backends.qualcomm.utils.utils import (
    generate_htp_compiler_spec,
    generate_qnn_executorch_compiler_spec,
    to_edge_transform_and_lower_to_qnn,
)

import qnn
from benchmarks import htp_faults, verdict

from .helpers import SOC


def _executorch_htp_fp16(module: nn.Module, inputs: tuple) -> torch.Tensor:
    """executorch 1.5.1's own QNN flow (fp16, SM8650), the .pte run on the emulated HTP."""
    specs = generate_qnn_executorch_compiler_spec(SOC, generate_htp_compiler_spec(use_fp16=True))
    with torch.no_grad():
        exported = torch.export.export(module, inputs, strict=False).module()
        buffer = to_edge_transform_and_lower_to_qnn(exported, inputs, specs).to_executorch().buffer
    (out,) = qnn.run_pte(buffer, inputs)
    return out


def test_qnn_batch_norm_ignores_eps():
    """executorch 1.5.1's QNN BatchNorm builder (backends/qualcomm/builders/op_batch_norm.py)
    computes weight / sqrt(running_var + 1e-9) whatever the node's eps: one BatchNorm2d with
    torchvision MobileNetV3's eps=1e-3, fp32 input 1x4x8x8. HTP misses eager by far more than
    fp16's tolerance and matches the same BatchNorm with eps=1e-9; each channel is off by
    sqrt((var + 1e-3) / (var + 1e-9)). No upstream report found (onnxruntime fixed the same
    formula in its own QNN builder, microsoft/onnxruntime#17981)."""
    qnn.load_qnn_sdk()
    bn = nn.BatchNorm2d(4, eps=1e-3).eval()
    with torch.no_grad():
        bn.running_mean.zero_()
        bn.running_var.copy_(torch.tensor([1e-3, 1e-2, 1e-1, 1.0]))
    x = (torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0)),)
    got = _executorch_htp_fp16(bn, x)
    with torch.no_grad():
        want = bn(*x)
        as_computed = htp_faults._batch_norm_eps_ignored(torch.export.export(bn, x, strict=False).module())(*x)
    scale = float(want.abs().max())
    assert verdict.judge("fp16", float((got - want).abs().max()), scale).startswith("mismatch")
    assert verdict.judge("fp16", float((got - as_computed).abs().max()), float(as_computed.abs().max())) == "ok"
    ratio = (got / want).flatten(2).median(dim=2).values.flatten()
    expected = torch.sqrt((bn.running_var + 1e-3) / (bn.running_var + 1e-9))
    torch.testing.assert_close(ratio, expected, rtol=2e-3, atol=0)
    # the benchmark's attribution finds it
    note = htp_faults.attribute(torch.export.export(bn, x, strict=False).module(), x, [got], "fp16")
    assert note is not None and note.startswith("executorch 1.5.1: QNN's BatchNorm builder"), note
