"""Quantized benchmark models: PT2E with executorch's XNNPACKQuantizer (symmetric, per-channel
weights, static activations), calibrated on a few seeded random inputs.

The model returned is torchao's ``convert_pt2e`` result: an ATen GraphModule with explicit
quantize/dequantize ops, which ``torch.export`` exports as is. Its eager output is the
reference the lowered programs are compared with.
"""

from __future__ import annotations

import torch

from . import models

# The Llama is not here: torchao 0.18's prepare_pt2e turns the HF causal mask's index tensors
# into floats ("IndexError: tensors used as indices must be long, int, byte or bool tensors" in
# calibration, with set_global and with set_module_type(nn.Linear) alike); the quantized Llama
# shapes are covered by tests/test_quant.py's linear programs instead.
QUANTIZED_BASES = ("mobilenet_v3_small", "swin_v2_t")
SUFFIX = "_q8"


def quantized(base: str):
    """A builder for the 8-bit XNNPACK-quantized version of benchmark model `base`."""

    def build(quick: bool = False) -> models.ModelSpec:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        spec = models.build(base, quick=quick)
        with torch.no_grad():
            ep = torch.export.export(spec.module, spec.inputs)
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(ep.module(), quantizer)
        g = torch.Generator().manual_seed(models.SEED + 2)
        with torch.no_grad():
            for _ in range(2):
                prepared(*_like(spec.inputs, g))
            prepared(*spec.inputs)
        converted = convert_pt2e(prepared)
        note = "XNNPACKQuantizer symmetric static, per-channel weights (PT2E)"
        return models.ModelSpec(base + SUFFIX, converted, spec.inputs, note)

    build.__doc__ = f"{base}, 8-bit XNNPACK-quantized (PT2E)."
    return build


def _like(inputs, g):
    out = []
    for t in inputs:
        if t.dtype.is_floating_point:
            out.append(torch.randn(t.shape, generator=g, dtype=t.dtype))
        else:
            out.append(torch.randint(0, int(t.max()) + 1, t.shape, generator=g, dtype=t.dtype))
    return tuple(out)


BUILDERS = {base + SUFFIX: quantized(base) for base in QUANTIZED_BASES}
