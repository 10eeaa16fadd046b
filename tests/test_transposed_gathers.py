"""`folding.rewrites.transposed_gathers`: row gathers of a stored matrix read its transpose, so a tied embedding is
stored once (as its transpose) and no call copies it. Each program is compared with the
unfolded one on random indices, eagerly and as a .pte, relative to the output's scale."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from folding import FoldPolicy, Reason, fold_constants
from folding.core.sizes import stored_constant_bytes
from tests.fold_checks import assert_same_over_calls, constant_only_ops, edge, export
from tests.invariants import (
    assert_close_all,
    assert_caller_unchanged,
    assert_report_bytes_true,
    assert_valid_program,
    caller_snapshot,
)
from tests.lowering import edge_pte, run_pte


class Tied(nn.Module):
    """A tied embedding read by ``embedding`` or ``index_select``, and by the output ``linear``."""

    def __init__(self, vocab: int, dim: int, gather: str):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.gather = gather

    def forward(self, ids):
        w = self.emb.weight
        h = self.emb(ids) if self.gather == "embedding" else w.index_select(0, ids.reshape(-1)).reshape(*ids.shape, -1)
        return F.linear(self.norm(h), w)


def _check_against_unfolded(program, result, vocab: int, shape: tuple, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pte = edge_pte(result.program) if getattr(program, "dialect", "") == "EDGE" else None
    for _ in range(3):
        ids = torch.randint(0, vocab, shape, generator=g)
        with torch.no_grad():
            want = program.module()(ids)
            got = result.program.module()(ids)
        scale = want.abs().max().item()
        assert scale > 1e-2
        assert (want - got).abs().max().item() <= 1e-5 * scale
        if pte is not None:
            (ran,) = run_pte(pte, (ids,))
            assert (want - ran).abs().max().item() <= 1e-4 * scale


@pytest.mark.parametrize("gather", ["embedding", "index_select"])
@pytest.mark.parametrize("seed", range(4))
def test_a_tied_matrix_is_stored_once_as_its_transpose(gather, seed):
    """Seeded shapes: vocabulary, width, index rank (1 to 3); the matrix exceeds the 1 MiB budget."""
    g = torch.Generator().manual_seed(seed)
    vocab, dim = int(torch.randint(3000, 9000, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g)) * 64
    shape = [(9,), (1, 8), (2, 3, 4), (2, 5)][seed]
    ep = edge(export(Tied(vocab, dim, gather).eval(), (torch.randint(0, vocab, shape),)))
    before = caller_snapshot(ep)
    result = fold_constants(ep)
    assert_caller_unchanged(before, ep)
    assert_valid_program(result.program)
    assert_report_bytes_true(result)
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(ep)
    assert len(result.report.rewrites) == 1, result.report.rewrites
    assert "p_emb_weight" in result.report.removed_placeholders
    ops = [str(n.target) for n in result.program.graph.nodes if n.op == "call_function"]
    assert not [o for o in ops if "permute" in o and n_bytes_of(result.program, o) >= vocab * dim * 4]
    _check_against_unfolded(ep, result, vocab, shape, seed)


def n_bytes_of(program, target: str) -> int:
    """Largest output, in bytes, of the nodes of `program` calling `target`."""
    sizes = [n.meta["val"].numel() * n.meta["val"].element_size() for n in program.graph.nodes
             if n.op == "call_function" and str(n.target) == target]
    return max(sizes, default=0)


def test_a_budget_that_fits_both_copies_leaves_the_gather_alone():
    ep = edge(export(Tied(4000, 64, "embedding").eval(), (torch.randint(0, 4000, (1, 8)),)))
    result = fold_constants(ep, FoldPolicy(max_growth_bytes=None, max_growth_fraction=None))
    assert not result.report.rewrites
    assert any("embedding" in str(n.target) for n in result.program.graph.nodes)
    _check_against_unfolded(ep, result, 4000, (1, 8), 0)


def test_no_rewrite_when_the_transpose_is_a_skipped_target():
    """Rewriting would then copy the matrix on every call (the transpose stays an op)."""
    ep = edge(export(Tied(6000, 64, "embedding").eval(), (torch.randint(0, 6000, (1, 8)),)))
    result = fold_constants(ep, FoldPolicy(skip_targets=frozenset({"aten.permute_copy"})))
    assert not result.report.rewrites
    assert any("embedding" in str(n.target) for n in result.program.graph.nodes)
    _check_against_unfolded(ep, result, 6000, (1, 8), 1)


def test_the_transpose_that_replaces_its_matrix_is_not_held_to_max_tensor_bytes():
    """It stores no byte more than the program did; every other value keeps the cap."""
    ep = edge(export(Tied(6000, 64, "embedding").eval(), (torch.randint(0, 6000, (1, 8)),)))
    cap = 1024
    result = fold_constants(ep, FoldPolicy(max_tensor_bytes=cap))
    assert result.report.rewrites
    big = [c for c in result.report.lifted if c.nbytes > cap]
    assert [c.shape for c in big] == [(64, 6000)], result.report.lifted
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(ep)
    _check_against_unfolded(ep, result, 6000, (1, 8), 1)


def test_indices_of_dynamic_shape_are_left_alone():
    ids = torch.randint(0, 6000, (1, 8))
    ep = torch.export.export(Tied(6000, 64, "embedding").eval(), (ids,),
                             dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
    ep = edge(ep)
    result = fold_constants(ep)
    assert not result.report.rewrites
    for n in (3, 8, 17):
        x = torch.randint(0, 6000, (1, n))
        with torch.no_grad():
            assert_close_all(ep.module()(x), result.program.module()(x))


def test_aten_dialect_transpose_readers_and_inplace():
    """ATen training IR: ``w.t()`` read by a matmul, rows gathered by ``embedding``; in place."""

    class TiedMatmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5000, 64)

        def forward(self, ids):
            return torch.tanh(self.emb(ids)) @ self.emb.weight.t()

    ids = torch.randint(0, 5000, (2, 6))
    ep = export(TiedMatmul().eval(), (ids,))
    reference = copy.deepcopy(ep)
    result = fold_constants(ep, inplace=True)
    assert result.program is ep and result.report.rewrites
    assert stored_constant_bytes(ep) <= stored_constant_bytes(reference)
    _check_against_unfolded(reference, result, 5000, (2, 6), 2)


class TiedThenView(nn.Module):
    """A tied embedding whose gathered rows a later ``view`` merges (a dims-merging ``view``
    needs the contiguous strides the gather gives), and the transpose the output reads."""

    def __init__(self, gather: str, merge: str):
        super().__init__()
        self.emb = nn.Embedding(2048, 256)  # 2 MiB: beyond the 1 MiB growth budget
        self.gather, self.merge = gather, merge

    def forward(self, ids, h):
        w = self.emb.weight
        e = self.emb(ids) if self.gather == "embedding" else w.index_select(0, ids.reshape(-1))
        flat = e.view(e.shape[0], -1) if self.merge == "view" else e.view(-1)
        return flat.sum(-1), h @ w.t()


@pytest.mark.parametrize("gather", ["embedding", "index_select"])
@pytest.mark.parametrize("merge", ["view", "flatten"])
@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_the_rewritten_gather_has_the_strides_of_the_gather_it_replaces(gather, merge, dialect):
    """Issue 52: in ATen the rewrite ended in a ``permute`` view of other strides, so the
    folded program raised on a later dims-merging ``view`` where the unfolded one runs. Each
    rewritten gather's ``meta["val"]`` has the gather's shape, dtype and strides; the folded
    program matches the unfolded one eagerly and as a portable .pte."""
    ids, h = torch.randint(0, 2048, (2, 5)), torch.randn(3, 256)
    ep = export(TiedThenView(gather, merge).eval(), (ids, h))
    ep = edge(ep) if dialect == "edge" else ep
    before = {n.name: n.meta["val"] for n in ep.graph.nodes if op_name_of(n) in _GATHER_OPS}
    result = fold_constants(ep)
    assert len(result.report.rewrites) == 1, result.report.rewrites
    assert_report_bytes_true(result)
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(ep)
    for name, old in before.items():
        (new,) = [n.meta["val"] for n in result.program.graph.nodes if n.name == name]
        assert (new.shape, new.dtype, new.stride()) == (old.shape, old.dtype, old.stride()), name
    pte = edge_pte(result.program if dialect == "edge" else edge(result.program))
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids, h = torch.randint(0, 2048, (2, 5), generator=g), torch.randn(3, 256, generator=g)
        with torch.no_grad():
            want = ep.module()(ids, h)
            got = result.program.module()(ids, h)
        ran = run_pte(pte, (ids, h))
        for w, g_, r in zip(want, got, ran):
            scale = w.abs().max().item()
            assert (w - g_).abs().max().item() <= 1e-5 * scale
            assert (w - r).abs().max().item() <= 1e-4 * scale


_GATHER_OPS = {"aten.embedding.default", "aten.index_select.default"}


def op_name_of(node) -> str:
    from folding.core.ops import op_name

    return op_name(node.target) if node.op == "call_function" else ""


class _BigLinear(nn.Module):
    """A 20 MiB weight (above the default 16 MiB cap), read by ``linear`` only, or also by a sum."""

    def __init__(self, also_summed: bool):
        super().__init__()
        self.lin = nn.Linear(2560, 2048, bias=False)
        self.also_summed = also_summed

    def forward(self, x):
        y = self.lin(x)
        return y + self.lin.weight.sum() if self.also_summed else y


def test_the_transpose_of_a_weight_only_transposes_read_folds_whatever_its_size():
    """Edge reads every linear weight through ``permute_copy``: kept for its size, it would copy
    the weight on every call; folded, it replaces the weight (constant_prop_pass folds it too)."""
    x = torch.randn(2, 2560)
    ep = edge(export(_BigLinear(False).eval(), (x,)))
    result = fold_constants(ep)
    assert [c.shape for c in result.report.lifted] == [(2560, 2048)]
    assert "p_lin_weight" in result.report.removed_placeholders
    assert stored_constant_bytes(result.program) == stored_constant_bytes(ep)
    assert not [n for n in result.program.graph.nodes if n.op == "call_function" and "permute" in str(n.target)]
    with torch.no_grad():
        want, got = ep.module()(x), result.program.module()(x)
    assert (want - got).abs().max().item() <= 1e-5 * want.abs().max().item()
    (ran,) = run_pte(edge_pte(result.program), (x,))
    assert (want - ran).abs().max().item() <= 1e-4 * want.abs().max().item()


def test_a_weight_another_op_reads_keeps_the_cap():
    """The weight stays (the sum reads it), so its transpose would be a second 20 MiB tensor:
    above max_tensor_bytes, it stays an op."""
    x = torch.randn(2, 2560)
    ep = edge(export(_BigLinear(True).eval(), (x,)))
    result = fold_constants(ep)
    assert all(c.nbytes <= 16 * 2**20 for c in result.report.lifted), result.report.lifted
    assert any(n.op == "call_function" and "permute" in str(n.target) for n in result.program.graph.nodes)
    with torch.no_grad():
        want, got = ep.module()(x), result.program.module()(x)
    assert (want - got).abs().max().item() <= 1e-5 * want.abs().max().item()


class TiedEmbeddingLM(nn.Module):
    def __init__(self, vocab=8000, dim=128):  # a 4 MB matrix: larger than the 1 MiB budget floor
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids):
        return F.linear(self.norm(self.emb(ids)), self.emb.weight)


def test_tied_embedding_matrix_is_stored_once_in_edge_program():
    from executorch.exir import to_edge

    ids = torch.randint(0, 8000, (1, 8))
    edge = to_edge(torch.export.export(TiedEmbeddingLM().eval(), (ids,))).exported_program()
    # Edge decomposes linear: permute_copy(emb.weight) is constant-only while embedding still reads it.
    assert any("permute" in str(n.target) for n in constant_only_ops(edge))
    result = fold_constants(edge)
    assert_report_bytes_true(result)
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(edge)
    # The embedding reads the transpose (folding.rewrites.transposed_gathers), so the transpose is stored instead
    # of the matrix, not beside it, and no call copies the matrix.
    big = [c for c in result.report.lifted if c.nbytes >= 8000 * 128 * 4]
    assert len(big) == 1 and big[0].shape == (128, 8000), big
    assert "p_emb_weight" in result.report.removed_placeholders
    assert result.report.rewrites and "p_emb_weight" in result.report.rewrites[0]
    reasons = {d.node: d.reason for d in result.report.decisions}
    assert reasons["aten_permute_copy_default"] is Reason.FOLDED
    x = torch.randint(0, 8000, (1, 8))
    assert_close_all(edge.module()(x), result.program.module()(x))


class _TiedWrittenInGraph(nn.Module):
    """A tied matrix ``W`` (a buffer) gathered by ``embedding`` and read by a matmul through
    ``W.t()``, which the graph also writes in place (torch 2.14's training IR: ``t`` then
    ``mul_``, not a BUFFER_MUTATION output), before or after the gather."""

    def __init__(self, before: bool):
        super().__init__()
        self.register_buffer("W", torch.randn(5000, 64, generator=torch.Generator().manual_seed(3)))
        self.before = before

    def forward(self, ids):
        if self.before:
            self.W.t().mul_(0.5)
        out = torch.tanh(F.embedding(ids, self.W)) @ self.W.t()
        if not self.before:
            self.W.t().add_(0.25)
        return out


@pytest.mark.parametrize("before", [True, False])
def test_a_tied_matrix_the_graph_writes_is_not_rewritten(before):
    """Only an unchanging stored matrix is read through its transpose
    (`unchanging.unchanging_before_probes`); outputs agree over 3 calls."""
    ids = torch.randint(0, 5000, (2, 6), generator=torch.Generator().manual_seed(4))
    ep = export(_TiedWrittenInGraph(before), (ids,))
    result = fold_constants(ep)
    assert_same_over_calls(ep, result.program, (ids,))
    assert result.report.rewrites == []


@pytest.mark.parametrize("dims", [(0, 1), (-2, -1), (1, 0)])
def test_a_transpose_of_either_dim_order_is_read_through(dims):
    """``w.transpose(0, 1)`` is the same 2-D transpose as ``w.transpose(1, 0)``: the gathers read
    it and the matrix is stored once, whichever order names the two dims."""

    class TiedTranspose(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5000, 64)

        def forward(self, ids):
            return torch.tanh(self.emb(ids)) @ self.emb.weight.transpose(*dims)

    ids = torch.randint(0, 5000, (2, 6))
    ep = export(TiedTranspose().eval(), (ids,))
    result = fold_constants(ep)
    assert len(result.report.rewrites) == 1, result.report.rewrites
    assert "p_emb_weight" in result.report.removed_placeholders
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(ep)
    _check_against_unfolded(ep, result, 5000, (2, 6), 3)
