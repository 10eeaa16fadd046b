"""Differential tests on the benchmark models: folded vs unfolded, eagerly and as a .pte.

Each model is exported, folded with the default policy, compared eagerly on a fresh random
input, then lowered for the portable runtime and run in the ExecuTorch runtime.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.graph_stats import constant_only_node_names
from benchmarks.models import BUILDERS, QNN_ONLY_MODELS, build
from folding import FoldPolicy, Reason, fold_constants
from tests.invariants import (
    assert_close_all,
    assert_constant_only_nodes_reported,
    assert_kept_names,
    assert_report_bytes_true,
    assert_valid_program,
    lower_portable,
)
from tests.lowering import run_pte


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
# quantization rules themselves are pinned bit-exactly in tests/test_quant.py. The QNN-only
# LLM-scale model (`llama_1b`, 1.5 GB of weights) is measured by the benchmark, not here.
FLOAT_MODELS = sorted(name for name in BUILDERS if not name.endswith("_q8") and name not in QNN_ONLY_MODELS)
# The two transformers whose portable .pte takes minutes (vit_b_16's attention on portable
# kernels): slow tier; the smaller models pin the same rules in the default tier.
SLOW_MODELS = {"vit_b_16", "swin_v2_t"}


@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.slow) if m in SLOW_MODELS else m for m in FLOAT_MODELS])
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
    # invariant 3, by benchmarks/graph_stats.py's walk of the folded program
    assert_constant_only_nodes_reported(result.program, result.report)


def test_folded_model_matches_unfolded_eagerly(folded_model):
    name, spec, ep, result = folded_model
    x = _fresh_inputs(spec)
    with torch.no_grad():
        want, got = ep.module()(*x), result.program.module()(*x)
    # relative to the output's scale: a folded transpose stored contiguous (`folding.rewrites.transposed_gathers`)
    # changes a matmul's summation order, which moves fp32 logits by ~1e-6 of their scale
    scale = want.abs().max().item()
    assert scale > 1e-3, f"{name}: output scale {scale:.3g} is too close to zero to compare"
    assert (got - want).abs().max().item() <= 1e-5 * scale, (name, (got - want).abs().max().item(), scale)


def test_folded_model_pte_runs_and_matches_eager(folded_model):
    name, spec, ep, result = folded_model
    x = _fresh_inputs(spec)
    with torch.no_grad():
        want = spec.module(*x)
    buffer, added_by_lowering = lower_portable(result.program)
    (got,) = run_pte(buffer, x)
    assert_close_all(want, got, 1e-4, 1e-4)
    # invariant 5, measured on the .pte: the report's bytes plus at most the scalars lowering lifted
    assert_report_bytes_true(result, buffer, added_by_lowering)


class KeptChain(nn.Module):
    """Constant-only ops kept for a reason: `exp` is in `skip_targets`, the ops after it depend
    on it; `mul` before it folds."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        w = (self.w * 0.5).exp()
        return F.linear(x, w.t() + 1.0)


def test_invariant_3_check_fails_when_a_constant_only_node_has_no_kept_decision():
    """The check above can fail: on a real folded program with kept constant-only nodes it
    passes, and it fails once one of their decisions is dropped or says RUNTIME_INPUT."""
    ep = torch.export.export(KeptChain(), (torch.randn(2, 8),))
    result = fold_constants(ep, FoldPolicy(skip_targets=frozenset({torch.ops.aten.exp.default})))
    left = constant_only_node_names(result.program)
    reasons = {d.node: d.reason for d in result.report.decisions}
    assert left == ["exp", "t", "add"], left
    assert reasons["exp"] is Reason.SKIPPED_TARGET and reasons["mul"] is Reason.FOLDED
    assert_constant_only_nodes_reported(result.program, result.report)
    for name in left:
        dropped = dataclasses.replace(result.report, decisions=[d for d in result.report.decisions if d.node != name])
        with pytest.raises(AssertionError, match=f"{name}: no decision"):
            assert_constant_only_nodes_reported(result.program, dropped)
        relabelled = dataclasses.replace(result.report, decisions=[
            dataclasses.replace(d, reason=Reason.RUNTIME_INPUT) if d.node == name else d for d in result.report.decisions
        ])
        with pytest.raises(AssertionError, match=f"{name}: reported RUNTIME_INPUT"):
            assert_constant_only_nodes_reported(result.program, relabelled)


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
