"""Differential tests on the benchmark models: folded vs unfolded, eagerly and as a .pte.

Each model is exported, folded with the default policy, compared eagerly on a fresh random
input, then lowered for the portable runtime and run in the ExecuTorch runtime.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.models import BUILDERS, build
from folding import Reason, fold_constants
from tests.invariants import (
    assert_kept_names,
    assert_pte_matches,
    assert_report_bytes_true,
    assert_valid_program,
)


def _fresh_inputs(spec):
    g = torch.Generator().manual_seed(123)
    out = []
    for t in spec.inputs:
        if t.dtype.is_floating_point:
            out.append(torch.randn(t.shape, generator=g, dtype=t.dtype))
        else:
            out.append(torch.randint(0, int(t.max()) + 1, t.shape, generator=g, dtype=t.dtype))
    return tuple(out)


# The float benchmark models. The quantized ones (`*_q8`) are compared in the benchmark; their
# portable kernels round differently from eager by up to one quantization step, and the
# quantization rules themselves are pinned bit-exactly in tests/test_quant.py.
FLOAT_MODELS = sorted(name for name in BUILDERS if not name.endswith("_q8"))


@pytest.fixture(scope="module", params=FLOAT_MODELS)
def folded_model(request):
    spec = build(request.param, quick=True)
    with torch.no_grad():
        ep = torch.export.export(spec.module, spec.inputs)
    result = fold_constants(ep)
    return request.param, spec, ep, result


def test_folded_model_is_valid_and_reports_true_bytes(folded_model):
    name, spec, ep, result = folded_model
    assert_valid_program(result.program)
    assert_report_bytes_true(result)
    assert_kept_names(ep, result.program, result.report)
    # invariant 3: every constant-only node left has a reason other than RUNTIME_INPUT
    assert all(d.reason is not Reason.RUNTIME_INPUT for d in result.report.kept_constant_only)


def test_folded_model_matches_unfolded_eagerly(folded_model):
    name, spec, ep, result = folded_model
    x = _fresh_inputs(spec)
    with torch.no_grad():
        want, got = ep.module()(*x), result.program.module()(*x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_folded_model_pte_runs_and_matches_eager(folded_model):
    name, spec, ep, result = folded_model
    x = _fresh_inputs(spec)
    with torch.no_grad():
        want = [spec.module(*x)]
    assert_pte_matches(result.program, x, "portable", expected=want, atol=1e-4)


def test_masks_fold_in_swin_and_llama():
    """The masks that executorch's constant_prop_pass leaves (aten.full, memory_format args,
    new_zeros + in-place fills) fold: no mask-building op is left constant-only."""
    for name in ("swin_v2_t", "llama"):
        spec = build(name, quick=True)
        with torch.no_grad():
            ep = torch.export.export(spec.module, spec.inputs)
        result = fold_constants(ep)
        mask_ops = ("full", "new_zeros", "triu", "tril", "masked_fill", "fill_", "arange")
        left = [d for d in result.report.kept_constant_only if d.target.split(".")[1] in mask_ops]
        assert not left, f"{name}: mask ops kept: {left}"
        assert any(d.folded and d.target.split(".")[1] in mask_ops for d in result.report.decisions), name
