"""Quantized programs built with the quantizers that ship with executorch and torchao."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


class LinearRelu(nn.Module):
    """The seed shape: ``x + F.linear(table, weight)`` then ``.relu()`` (constant-only linear)."""

    def __init__(self, tail: str = "relu") -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(4, 16))
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)
        self.out = nn.Linear(16, 16)
        self.tail = tail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = F.linear(self.table, self.weight)
        if self.tail == "relu":
            k = k.relu()
        elif self.tail == "bf16_roundtrip":
            k = k.to(torch.bfloat16).to(torch.float32)
        elif self.tail == "bf16_then_quantized":
            k = self.out(k.to(torch.bfloat16).float())
        return self.out(x + k)


class SharedWeight(nn.Module):
    """A weight read by a runtime linear and by a constant-only linear."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(4, 16))
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + F.linear(self.table, self.weight)


def calibrate_inputs(seed: int = 0, n: int = 4) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 16, generator=g),) for _ in range(n)]


def quantize(model: nn.Module, quantizer, inputs) -> torch.export.ExportedProgram:
    """PT2E: export, prepare, calibrate, convert, export again (ATen program with q/dq ops)."""
    model = model.eval()
    ep = torch.export.export(model, inputs[0])
    prepared = prepare_pt2e(ep.module(), quantizer)
    for args in inputs:
        prepared(*args)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, inputs[0])


def xnnpack_quantizer():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def qnn_quantizer(kind: str):
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype

    q = QnnQuantizer()
    dtype = {"8a8w": QuantDtype.use_8a8w, "16a8w": QuantDtype.use_16a8w, "16a4w_block": QuantDtype.use_16a4w_block}[kind]
    q.set_default_quant_config(dtype, is_linear_per_channel=True, is_conv_per_channel=True)
    if kind == "16a4w_block":
        q.set_block_size_map({"linear": (1, 8), "linear_1": (1, 8)})
    return q
