"""Stored tensors (`folding.core.sizes`): their layout (size-1 dimensions, observed strides), and byte
accounting in what the `.pte` really stores: the emitter stores one buffer per distinct byte
content, whatever its dtype, shape or name (executorch/exir/emit/_emitter.py), and the
accounting tells contents apart from the contents alone. Folded values with a stored
tensor's bytes: test_placement.py; the growth budget held in the `.pte`'s bytes: test_plan.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from folding import FoldPolicy
from folding.core.sizes import aligned, content_groups, distinct_bytes, has_canonical_layout, placeholder_savings
from tests.fold_checks import export, fold
from tests.programs import Block, IdenticalCopies, Layers
from tests.invariants import assert_close_all
from tests.invariants import assert_report_bytes_true, lower_portable, outputs, pte_constant_bytes
from tests.lowering import lower_pte, run_pte


# 1. Constant outputs and values with size-1 dimensions ---------------------------------------


class PermutedOutput(nn.Module):
    """The issue's example: a folded (1, 1, 1, 3) value returned as an output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(3, 1, 1, 1))

    def forward(self, x):
        return x + 1, self.w.permute(3, 2, 1, 0) * 2


class ConvWeightOutput(nn.Module):
    """A folded conv weight of shape (2, 1, 1) used by a conv and returned."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(1, 1, 2))

    def forward(self, x):
        w = self.b.permute(2, 1, 0) * 2.0
        return F.conv1d(x, w), w


class ExpandedUnit(nn.Module):
    """Size-1 dimensions from unsqueeze/expand/transpose, read by a runtime op."""

    def __init__(self):
        super().__init__()
        self.register_buffer("v", torch.randn(1, 4))

    def forward(self, x):
        u = self.v.t().unsqueeze(0).transpose(0, 2) * 3.0  # (1, 4, 1) with non-canonical strides
        return x * u, u + 0.0


@pytest.mark.parametrize("module, shape", [(PermutedOutput, (3,)), (ConvWeightOutput, (1, 1, 5)), (ExpandedUnit, (2, 4, 3))])
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_size_one_dimensions_are_stored_canonically_and_run(module, shape, backend):
    torch.manual_seed(0)
    x = torch.randn(shape)
    ep = export(module(), (x,))
    result = fold(ep)
    for t in result.program.constants.values():
        assert has_canonical_layout(t), t.stride()
    want = outputs(ep, (x,))
    got = run_pte(lower_pte(result.program, backend), (x,))
    assert_close_all(want, got, atol=1e-5)


# 3. Strict policy on an in-place temporary ---------------------------------------------------


def test_strict_policy_with_a_temporary_cast_then_updated_in_place():
    class M(nn.Module):
        def forward(self, x):
            t = torch.linspace(0, 1, 4)
            h = t.to(torch.float16)
            t.add_(1.0)
            return x + t, h

    x = torch.randn(4)
    ep = export(M(), (x,))
    for policy in (FoldPolicy.strict(), FoldPolicy(), FoldPolicy.unlimited()):
        result = fold(ep, policy)
        assert_close_all(M()(x), outputs(result.program, (x,)))


# 5. Totals in the bytes the .pte stores ------------------------------------------------------


def test_report_totals_equal_the_serialized_constant_data():
    """With no scalar operands for lowering to lift, the .pte's constant data is exactly what
    the report says, before and after: identical buffers once, each padded to 16 bytes."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.ones(10))
            self.register_buffer("b", torch.ones(10))  # identical bytes: stored once
            self.register_buffer("c", torch.randn(10))

        def forward(self, x):
            return x + self.a + self.b, x * (self.c + self.c), x - torch.cat([self.c, self.a]).sum(0, keepdim=True)

    x = torch.randn(10)
    ep = export(M(), (x,))
    before = pte_constant_bytes(lower_pte(ep))  # the unfolded program, lowered once
    for policy in (FoldPolicy.unlimited(), FoldPolicy.strict()):
        result = fold(ep, policy)
        assert result.report.constant_bytes_before == before
        assert result.report.constant_bytes_after == pte_constant_bytes(lower_pte(result.program))


# 2. A stored value read by a delegated op and by an op left on the CPU -----------------------


class ConvAndNormalize(nn.Module):
    """The issue's example: under a zero-growth policy ``normalize(w)`` stays at runtime while
    ``w`` feeds the conv XNNPACK delegates."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(1, 1, 2))

    def forward(self, x):
        w = self.b.permute(2, 1, 0) * 2.0
        return F.conv1d(x, w), F.normalize(w, dim=-1)


class LinearAndKeptCopies(nn.Module):
    """A folded weight read by a delegated linear, by constant-only ops a small cap keeps, and
    returned as an output."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        w = self.w * 0.5
        big = w.repeat(4, 4)  # 4 KiB: above the cap, stays an op reading w
        return F.linear(x, w), big.sum(0) + w.sum(), w


@pytest.mark.parametrize("module, shape, policy", [
    (ConvAndNormalize, (1, 1, 5), FoldPolicy(max_growth_bytes=0, max_growth_fraction=0.0)),
    (ConvAndNormalize, (1, 1, 5), FoldPolicy.strict()),
    (LinearAndKeptCopies, (2, 8), FoldPolicy(max_tensor_bytes=1024)),
])
def test_value_shared_by_delegated_and_cpu_ops_lowers_for_xnnpack(module, shape, policy):
    torch.manual_seed(0)
    x = torch.randn(shape)
    ep = export(module(), (x,))
    result = fold(ep, policy)
    want = outputs(ep, (x,))
    for backend in ("xnnpack", "portable"):
        assert_close_all(want, run_pte(lower_pte(result.program, backend), (x,)), atol=1e-5)


# 7. Ops that observe strides: a stored constant is contiguous --------------------------------


def _seeded_outputs(program_or_module, inputs, seed: int = 0) -> list[torch.Tensor]:
    module = program_or_module.module() if hasattr(program_or_module, "module") else program_or_module
    torch.manual_seed(seed)
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


_STRIDED = {  # strided constant-only values, each read by an op that observes its strides
    "randn_like": lambda w, x: w + torch.randn_like(w) * 0.01,  # the fuzzer's case 11000385
    "rand_like": lambda w, x: torch.rand_like(w.exp()),  # through a folded elementwise op
    "bernoulli": lambda w, x: torch.bernoulli(w.sigmoid()),
    "dropout": lambda w, x: F.dropout(w, 0.5, training=True),
    "through_runtime_add": lambda w, x: torch.randn_like(w + x.reshape(w.shape)),
    "as_strided": lambda w, x: w.as_strided((2, 2), (1, 3)) + x.sum(),  # kept by the policy below
}
_POLICIES = {"as_strided": FoldPolicy(skip_targets=("aten.as_strided",), max_growth_bytes=None, max_growth_fraction=None)}


class StridedObserved(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.register_buffer("b", torch.randn(2, 3, 4))

    def forward(self, x):
        return self.fn(self.b.permute(2, 0, 1), x), x * 2


@pytest.mark.parametrize("name", sorted(_STRIDED))
def test_values_whose_strides_a_runtime_op_observes_stay_strided(name):
    """A folded value is stored contiguous; a random ``_like`` op (draws in memory order) or
    ``as_strided`` (reads the storage) would read different values from it. Such values stay
    at runtime with `Reason.LAYOUT_OBSERVED`, so the outputs are bit-identical to eager."""
    from folding import Reason

    module = StridedObserved(_STRIDED[name])
    x = torch.randn(24)
    ep = export(module, (x,))
    result = fold(ep, _POLICIES.get(name, FoldPolicy.unlimited()))
    want, got = _seeded_outputs(module, (x,)), _seeded_outputs(result.program, (x,))
    for w, g in zip(want, got):
        assert torch.equal(w, g), name
    reasons = {d.node: d.reason for d in result.report.decisions}
    assert reasons.get("permute") is Reason.LAYOUT_OBSERVED


def test_contiguous_values_read_by_random_ops_still_fold():
    """The rule keeps only what a stored copy would change: a contiguous folded value read by
    ``randn_like`` is folded."""
    from folding import Reason

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.randn(3, 4))

        def forward(self, x):
            w = self.b * 2.0
            return x + torch.randn_like(w) + w

    x = torch.randn(3, 4)
    ep = export(M(), (x,))
    result = fold(ep, FoldPolicy.unlimited())
    for w, g in zip(_seeded_outputs(ep, (x,)), _seeded_outputs(result.program, (x,))):
        assert torch.equal(w, g)
    assert {d.node: d.reason for d in result.report.decisions}["mul"] is Reason.FOLDED


def test_view_updated_in_place_and_observed_keeps_its_base_at_runtime():
    """Fuzz case 13001881, shrunk: ``randn_like`` keeps the strided view ``narrow`` and its
    in-place ``add_`` at runtime; the view's base must stay too (the in-place class stays
    whole), or every call adds 1 to the stored constant. Checked over two successive calls."""
    from folding import Reason

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w17 = nn.Parameter(torch.randn(1, 1, 3))
            self.w43 = nn.Parameter(torch.randn(2, 1, 1))

        def forward(self, x):
            v = F.conv1d(self.w17, self.w43).narrow(-1, 0, 1).add_(1.0)
            return v + torch.randn_like(v) * 0.01 + x

    module, x = M().eval(), torch.randn(1, 2, 1)
    ep = export(module, (x,))
    result = fold(ep, FoldPolicy())
    folded = result.program.module()
    for seed in (0, 1):  # the second call would see the first call's write
        for w, g in zip(_seeded_outputs(module, (x,), seed), _seeded_outputs(folded, (x,), seed)):
            assert torch.equal(w, g), seed
    reasons = {d.node: d.reason for d in result.report.decisions}
    assert reasons["narrow"] is Reason.LAYOUT_OBSERVED and reasons["conv1d"] is Reason.DEPENDS_ON_KEPT


# 8. Mutated buffers are not constant data ----------------------------------------------------


class CounterLikeAnIndex(nn.Module):
    """A mutated int64 counter whose initial bytes equal a constant index's (the fuzzer's case
    11000414): the serializer stores the index once in the constant data and the counter in
    the mutable-data segment, so the two must not be merged in the report."""

    def __init__(self):
        super().__init__()
        self.register_buffer("index", torch.zeros(1, dtype=torch.long))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("w", torch.randn(4, 3))

    def forward(self, x):
        self.steps.add_(1)
        return x + self.w.t()[self.index] * 2.0, self.steps + 0


def test_report_bytes_leave_out_mutated_buffers_even_when_identical_to_a_constant():
    """On the Edge program (whose scalar operands are already lifted), the report's totals are
    the `.pte`'s constant data exactly, before and after folding."""
    from tests.fold_checks import edge, edge_pte

    x = torch.randn(4)
    program = edge(export(CounterLikeAnIndex(), (x,)))
    result = fold(program, FoldPolicy.unlimited())
    assert result.report.constant_bytes_before == pte_constant_bytes(edge_pte(program))
    assert result.report.constant_bytes_after == pte_constant_bytes(edge_pte(result.program))


# 9. Identical bytes, counted once ------------------------------------------------------------


def test_identical_folded_tensors_in_two_layers_are_stored_once_in_the_pte():
    """Each layer's folded gate is a constant of its own; the `.pte` stores their bytes once and
    the report says so."""
    x = torch.randn(2, 8, 8)
    ep = export(Block(), (x,))
    result = fold(ep, FoldPolicy(fuse_into_weights=False))  # fusion would fold each gate into its layer
    exps = [d for d in result.report.decisions if d.target == "aten.exp.default"]
    assert len(exps) == 2 and all(d.folded for d in exps) and exps[0].lifted_as != exps[1].lifted_as
    gates = [t for t in result.program.constants.values() if t.shape == (8,)]
    assert len(gates) == 2 and torch.equal(gates[0], gates[1])
    pte, added = lower_portable(result.program)
    assert_report_bytes_true(result, pte, added)
    assert_close_all(outputs(ep, (x,)), run_pte(pte, (x,)), 1e-4, relative=True)


@pytest.mark.parametrize("make", [
    lambda p: p.select(2, 1).clone(),  # (1, 1) with strides (2, 2)
    lambda p: p.transpose(0, 2).clone(),  # (2, 1, 1) with strides (1, 2, 2)
    lambda p: p[..., :1].clone() * 1.0,
])
def test_identical_strided_values_are_counted_once(make):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.randn(1, 1, 2))

        def forward(self, x):
            return x + make(self.p).sum(), x * make(self.p).sum()

    x = torch.randn(3)
    ep = export(M(), (x,))
    result = fold(ep)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))
    assert len(result.report.lifted) == 2 and result.report.constant_bytes_after == aligned(4)


def test_same_bytes_in_another_dtype_or_shape_are_one_buffer():
    """The emitter keys buffers by their bytes alone (``hashlib.sha256(buffer_data)``)."""
    assert distinct_bytes([torch.zeros(8), torch.zeros(32, dtype=torch.uint8)]) == aligned(32)
    assert distinct_bytes([torch.zeros(1024), torch.zeros(2, 1024, dtype=torch.int16)]) == aligned(4096)
    assert distinct_bytes([torch.zeros(8), torch.zeros(1024)]) == aligned(32) + aligned(4096)


@pytest.mark.parametrize("n", [16, 4096])  # every byte sampled; some
def test_tensors_differing_in_one_byte_are_told_apart(n):
    a = torch.zeros(n, dtype=torch.uint8)
    for i in (1, n // 2 + 1, n - 2):
        b = a.clone()
        b[i] = 1
        assert content_groups([a, b, a.clone()]) == [0, 1, 0]
        assert distinct_bytes([a, b]) == 2 * aligned(n)


def test_views_count_their_values_in_row_major_order():
    w = torch.randn(40, 50)
    assert content_groups([w, w.t(), w.t().contiguous(), w.view(50, 40)]) == [0, 1, 1, 0]
    assert content_groups([w[:, ::2], w[:, ::2].clone()]) == [0, 0]


@pytest.mark.parametrize("n", [4, 400])
def test_a_lazy_conjugate_holds_its_values_not_its_storage(n):
    """``x.conj()`` views `x`'s storage with the conjugate bit set: the serializer stores its
    values, so it is identical to its resolved copy, not to `x`."""
    x = torch.randn(n, dtype=torch.complex64)
    assert content_groups([x, x.conj(), x.conj().resolve_conj()]) == [0, 1, 1]
    assert content_groups([-x, x._neg_view()]) == [0, 0]


def test_meta_tensors_are_never_identical():
    assert content_groups([torch.empty(8, device="meta"), torch.empty(8, device="meta")]) == [0, 1]


def test_identical_buffers_are_counted_once_before_and_after_a_fold():
    ep = torch.export.export(IdenticalCopies(), (torch.randn(4096),))
    result = fold(ep)
    assert result.report.constant_bytes_before == aligned(4096 * 4)
    pte, added = lower_portable(result.program)
    assert_report_bytes_true(result, pte, added)


def test_tied_weights_save_nothing_when_one_name_goes():
    """Dropping one name of a tied Parameter saves no byte: the other still stores them."""
    ep = torch.export.export(Layers().eval(), (torch.randn(2, 64),))
    saving = {n.name: b for n, b in placeholder_savings(ep.graph, ep).items()}
    assert saving["p_tied_weight"] == saving["p_tied_again_weight"] == 0
    assert saving["p_layers_0_weight"] == aligned(64 * 64 * 4)
