"""Which nodes fold and which stay, on real ATen and Edge programs, checked by value: eager
`module()` of the folded vs the unfolded program, and the .pte in the ExecuTorch runtime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim
from torch._export.verifier import SpecViolationError
from torch.export.graph_signature import InputKind

from folding import FoldPolicy, Reason
from folding.core.signature import input_specs_by_name
from tests.fold_checks import (
    assert_edge_pte_matches,
    call_targets,
    decision,
    decisions_for,
    edge,
    export,
    fold,
)
from tests.invariants import assert_close_all, assert_same_outputs
from tests.invariants import assert_pte_matches, outputs
from tests.lowering import lower_pte, run_pte


def _lifted_tensor(program, placeholder_name):
    spec = input_specs_by_name(program.graph_signature)[placeholder_name]
    assert spec.kind is InputKind.CONSTANT_TENSOR
    return program.constants[spec.target]


# 1. A constant chain returned as a graph output -------------------------------------------


class ConstantChainOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        c = self.w.t() * 2 + 1
        return x @ self.w + 1, c, c


def _assert_constant_outputs_are_clones_of_lifted_constants(program, n_const_outputs):
    out = program.graph.output_node().args[0]
    specs = input_specs_by_name(program.graph_signature)
    const_outs = [
        a for a in out
        if a.all_input_nodes
        and all(i.op == "placeholder" and specs[i.name].kind is not InputKind.USER_INPUT for i in a.all_input_nodes)
    ]
    assert len(const_outs) == n_const_outputs
    for a in const_outs:
        assert "clone" in str(a.target), f"constant output {a.name} is {a.target}, not a clone"
        (src,) = a.all_input_nodes
        assert specs[src.name].kind is InputKind.CONSTANT_TENSOR
    assert [getattr(s.arg, "name", None) for s in program.graph_signature.output_specs] == [a.name for a in out]


def test_constant_chain_output_is_a_clone_of_a_lifted_constant_and_pte_runs():
    ep = export(ConstantChainOutput(), (torch.randn(3, 4),))
    result = fold(ep)
    assert {"t", "mul", "add"} <= {d.node for d in result.report.folded}
    _assert_constant_outputs_are_clones_of_lifted_constants(result.program, 2)
    x = torch.randn(3, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


def test_constant_chain_output_runs_with_xnnpack():
    ep = export(ConstantChainOutput(), (torch.randn(3, 4),))
    result = fold(ep)
    x = torch.randn(3, 4)
    assert_pte_matches(result.program, (x,), "xnnpack", expected=outputs(ep, (x,)))


def test_constant_chain_output_of_edge_program_with_dim_order_ops_runs():
    ep = edge(export(ConstantChainOutput(), (torch.randn(3, 4),)))
    result = fold(ep)
    _assert_constant_outputs_are_clones_of_lifted_constants(result.program, 2)
    x = torch.randn(3, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_edge_pte_matches(result.program, (x,), want)


class OnlyConstantChainOutput(torch.nn.Module):
    """An Edge graph of this has no dim-order op at all (relu, permute_copy, exp)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return torch.relu(x), self.w.t().exp()


def test_constant_output_of_edge_program_without_dim_order_ops_folds_and_runs():
    ep = edge(export(OnlyConstantChainOutput(), (torch.randn(4, 4),)))
    result = fold(ep)
    _assert_constant_outputs_are_clones_of_lifted_constants(result.program, 1)
    x = torch.randn(4, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_edge_pte_matches(result.program, (x,), want)


# 5. Dynamic batch dimension -----------------------------------------------------------------


class DynamicBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        ones = torch.ones(x.shape[0], 4)  # constant-only but its shape is symbolic
        return x @ (self.w.t() * 2) + self.b.exp() + ones


def test_dynamic_batch_folds_static_constants_and_runs_at_several_batch_sizes():
    ep = export(DynamicBatch(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    result = fold(ep)
    report = result.report
    for name in ("t", "mul", "exp"):
        assert decision(report, name).folded
    assert decision(report, "ones").reason is Reason.SYMBOLIC
    assert "aten.ones.default" in call_targets(result.program)
    for batch in (1, 5, 16):
        assert_same_outputs(ep, result.program, (torch.randn(batch, 4),))
    buffer = lower_pte(result.program)
    for batch in (2, 9):
        x = torch.randn(batch, 4)
        assert_close_all(outputs(ep, (x,)), run_pte(buffer, (x,)), atol=1e-4)


# 6. Attention masks -------------------------------------------------------------------------


class CausalMask(torch.nn.Module):
    """Llama-style: full(-inf) + triu for the additive mask, a tril bool mask with masked_fill."""

    def forward(self, scores):
        s = scores.shape[-1]
        mask = torch.full((s, s), float("-inf"))
        mask = torch.triu(mask, diagonal=1)
        keep = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
        bias = torch.zeros(s, s).masked_fill(keep, 0.5)
        return torch.softmax(scores + mask + bias, -1)


MASK_OPS = {"aten.full.default", "aten.triu.default", "aten.ones.default", "aten.tril.default",
            "aten.bitwise_not.default", "aten.zeros.default"}


def test_causal_mask_from_full_triu_masked_fill_is_folded():
    ep = export(CausalMask(), (torch.randn(2, 8, 8),))
    result = fold(ep)
    assert not MASK_OPS & set(call_targets(result.program))
    assert decisions_for(result.report, "aten.masked_fill.Scalar")[1].folded  # the constant bias
    x = torch.randn(2, 8, 8)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


def test_causal_mask_in_edge_program_is_folded():
    ep = edge(export(CausalMask(), (torch.randn(2, 8, 8),)))
    result = fold(ep)
    # Only the runtime chain (masked_fill/where on scores, add, softmax) stays.
    assert not result.report.kept_constant_only, result.report.kept_constant_only
    assert {d.reason for d in result.report.decisions if not d.folded} == {Reason.RUNTIME_INPUT}
    assert "aten.full.default" not in call_targets(result.program)
    x = torch.randn(2, 8, 8)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_edge_pte_matches(result.program, (x,), want)


class ShiftedWindowMask(torch.nn.Module):
    """Swin's shifted-window attention mask: zeros + slice assignment (in-place fill_ in the
    training IR), window partition, pairwise difference, masked_fill."""

    def forward(self, attn):
        H = W = 8
        ws, shift = 4, 2
        img_mask = torch.zeros((1, H, W, 1))
        cnt = 0
        for h in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for w in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                img_mask[:, h, w, :] = cnt
                cnt += 1
        windows = img_mask.view(1, H // ws, ws, W // ws, ws, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws)
        mask = windows.unsqueeze(1) - windows.unsqueeze(2)
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        return attn + mask


def test_shifted_window_mask_built_by_slice_assignment_is_folded():
    ep = export(ShiftedWindowMask(), (torch.randn(2, 4, 16, 16),))
    assert "aten.fill_.Tensor" in call_targets(ep)  # the slice assignment is in place
    result = fold(ep)
    assert call_targets(result.program) == ["aten.add.Tensor"]
    (lifted,) = result.report.lifted
    assert lifted.shape == (4, 16, 16)
    value = _lifted_tensor(result.program, lifted.placeholder)
    assert set(value.unique().tolist()) == {0.0, -100.0}  # a real mask, not zeros
    x = torch.randn(2, 4, 16, 16)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


def test_shifted_window_mask_in_edge_program_is_folded():
    ep = edge(export(ShiftedWindowMask(), (torch.randn(2, 4, 16, 16),)))
    result = fold(ep)
    assert call_targets(result.program) == ["aten.add.Tensor"]
    x = torch.randn(2, 4, 16, 16)
    assert_same_outputs(ep, result.program, (x,))


# 7. Assorted constant ops -------------------------------------------------------------------


class AssortedConstantOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))
        self.g = torch.nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x):
        idx = torch.tensor([[0, 1, 2, 3], [3, 2, 0, 1]])
        src = self.w[:2] * 3
        scattered = torch.zeros(4, 4).scatter(0, idx, src)
        added = torch.ones(4, 4).scatter_add(0, idx, src)
        reduced = torch.full((4, 4), -1.0).scatter_reduce(0, idx, src, reduce="amax", include_self=False)
        normed = F.rms_norm(self.w, (4,), self.g, eps=1e-6)
        unshuffled = F.pixel_unshuffle(self.w.reshape(1, 1, 4, 4), 2).reshape(4, 4)
        twos = torch.full_like(self.w, 2.0, memory_format=torch.preserve_format)
        return x * twos + scattered + added + reduced + normed + unshuffled


ASSORTED_OPS = ("aten.scatter.src", "aten.scatter_add.default", "aten.scatter_reduce.two",
                "aten.rms_norm.default", "aten.pixel_unshuffle.default", "aten.full_like.default")


def test_scatter_rms_norm_pixel_unshuffle_full_like_on_constants_fold():
    ep = export(AssortedConstantOps(), (torch.randn(4, 4),))
    result = fold(ep)
    for target in ASSORTED_OPS:
        ds = decisions_for(result.report, target)
        assert ds and all(d.folded for d in ds), (target, ds)
        assert target not in call_targets(result.program)
    x = torch.randn(4, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


def test_full_like_with_preserve_format_folds_in_edge_program():
    ep = edge(export(AssortedConstantOps(), (torch.randn(4, 4),)))
    result = fold(ep)
    (full_like,) = decisions_for(result.report, "aten.full_like.default")
    assert full_like.folded
    assert not {"aten.scatter.src", "aten.scatter_add.default", "aten.scatter_reduce.two"} & set(
        call_targets(result.program)
    )
    x = torch.randn(4, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_edge_pte_matches(result.program, (x,), want)


# 11. Stored constants are contiguous, detached, own their storage ---------------------------


class TransposedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 4))  # requires_grad=True, as exported

    def forward(self, x):
        return F.linear(x, self.w.t())


def test_folded_transpose_of_trainable_parameter_is_detached_and_lowers_with_xnnpack():
    ep = export(TransposedWeight(), (torch.randn(2, 8),))
    assert ep.state_dict["w"].requires_grad
    result = fold(ep)
    (lifted,) = result.report.lifted
    value = _lifted_tensor(result.program, lifted.placeholder)
    assert not value.requires_grad and value._base is None and value.is_contiguous()
    torch.testing.assert_close(value, ep.state_dict["w"].detach().t())
    x = torch.randn(2, 8)
    assert_pte_matches(result.program, (x,), "xnnpack", expected=outputs(ep, (x,)))


class NonContiguousConstants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(3, 4, 2))
        self.b = torch.nn.Parameter(torch.randn(1, 8))

    def forward(self, x):
        permuted = self.p.permute(1, 2, 0).reshape(8, 3).t()  # [3, 8] view of a permute
        expanded = self.b.expand(3, 8)
        return x * permuted + expanded, self.p.permute(2, 0, 1)


def test_non_contiguous_folded_results_are_stored_contiguous_and_portable_pte_runs():
    ep = export(NonContiguousConstants(), (torch.randn(3, 8),))
    result = fold(ep)
    assert result.report.lifted
    for lifted in result.report.lifted:
        value = _lifted_tensor(result.program, lifted.placeholder)
        assert value.is_contiguous() and value.stride() == torch.empty(value.shape).stride()
    assert not {"aten.permute.default", "aten.expand.default", "aten.t.default"} & set(call_targets(result.program))
    x = torch.randn(3, 8)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


# 14. _assert_tensor_metadata on a folded value ----------------------------------------------


class CastWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        h = (self.w * 2).to(torch.float64)  # training IR: _assert_tensor_metadata(mul) + to
        return x.to(torch.float64) @ h


def _assert_metadata_nodes(program):
    return [n for n in program.graph.nodes if n.target is torch.ops.aten._assert_tensor_metadata.default]


def test_assert_tensor_metadata_on_folded_value_is_checked_and_dropped():
    ep = export(CastWeight(), (torch.randn(2, 4),))
    asserts = _assert_metadata_nodes(ep)
    on_constant = [n for n in asserts if n.args[0].name == "mul"]
    assert len(on_constant) == 1, "torch.export no longer emits the assert on the cast weight"
    result = fold(ep)
    d = decision(result.report, on_constant[0].name)
    assert d.reason is Reason.CHECKED and d.folded
    # Only the runtime assert (on x) remains; the intermediate `mul` is not stored.
    remaining = _assert_metadata_nodes(result.program)
    assert [n.args[0].name for n in remaining] == ["x"]
    (lifted,) = result.report.lifted
    assert lifted.replaces == ("to",) and lifted.dtype == "float64"
    assert result.report.constant_bytes_after == 4 * 4 * 8
    x = torch.randn(2, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    assert_pte_matches(result.program, (x,), expected=want)


def test_failing_assert_tensor_metadata_on_constant_is_kept_with_its_error():
    ep = export(CastWeight(), (torch.randn(2, 4),))
    (check,) = [n for n in _assert_metadata_nodes(ep) if n.args[0].name == "mul"]
    check.kwargs = {**check.kwargs, "dtype": torch.float16}  # mul is float32: the check fails
    ep.graph_module.recompile()
    result = fold(ep)
    d = decision(result.report, check.name)
    assert d.reason is Reason.EVALUATION_ERROR and d.detail
    assert check.name in {n.name for n in result.program.graph.nodes}
    mul = decision(result.report, "mul")
    assert mul.folded and mul.lifted_as  # the kept check reads it


def test_assert_tensor_metadata_kept_when_fold_asserts_is_off():
    ep = export(CastWeight(), (torch.randn(2, 4),))
    (check,) = [n for n in _assert_metadata_nodes(ep) if n.args[0].name == "mul"]
    result = fold(ep, FoldPolicy(fold_asserts=False))
    d = decision(result.report, check.name)
    assert not d.folded and d.reason.constant_only
    assert_same_outputs(ep, result.program, (torch.randn(2, 4),))


class RuntimeShapedFills(torch.nn.Module):
    """Zero fills shaped like the activation (SDPA's decomposition builds one per attention):
    one read directly by a runtime op, one that a constant op reads first."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        bias = torch.zeros_like(x)  # read only by the runtime add: stays a fill
        shifted = torch.ones_like(x) * self.w  # the fill feeds a constant op: folds with it
        return x + bias, x * shifted


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_fill_of_runtime_shape_read_by_runtime_ops_is_not_stored(dialect):
    ep = export(RuntimeShapedFills(), (torch.randn(4, 4),))
    if dialect == "edge":
        ep = edge(ep)
    result = fold(ep)
    (bias, ones) = sorted(
        decisions_for(result.report, "aten.zeros_like.default") + decisions_for(result.report, "aten.ones_like.default")
        + decisions_for(result.report, "aten.full_like.default"),
        key=lambda d: d.reason is not Reason.FILL_OF_RUNTIME_SHAPE,
    )
    assert bias.reason is Reason.FILL_OF_RUNTIME_SHAPE and not bias.reason.constant_only
    assert ones.folded
    # Only the product w * 1 is stored: 4 x 4 float32.
    assert result.report.constant_bytes_after == 64
    x = torch.randn(4, 4)
    want = assert_same_outputs(ep, result.program, (x,))
    if dialect == "edge":
        assert_edge_pte_matches(result.program, (x,), want)
    else:
        assert_pte_matches(result.program, (x,), expected=want)
