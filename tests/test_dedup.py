"""Identical bytes (`folding.dedup`): the one rule behind the byte accounting and the reuse of a
stored tensor. Tensors holding identical bytes are stored once, whatever their dtype, shape or
strides, as the ExecuTorch emitter stores them (one buffer per distinct byte content,
executorch/exir/emit/_emitter.py); the rule reads as few bytes as it can (views of one storage
are not read, fingerprints of sampled bytes first, whole reads at most once per fold). The cost
tests count the bytes it reads and the digests it computes; they do not time anything.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import FoldPolicy, fold_constants
import folding.dedup as dedup
from folding.dedup import IdenticalBytes, IdenticalTensors, fold_scope
from folding.work_counts import counting
from folding.dedup import placeholder_savings
from folding.sizes import aligned, distinct_bytes
from tests.fold_checks import export, fold
from tests.invariants import assert_close_all, assert_same_outputs
from tests.invariants import assert_report_bytes_true, outputs
from tests.programs import Block, IdenticalCopies, Layers


# Identical folded values stored once ------------------------------------------------------


def test_identical_folded_tensors_in_two_layers_are_stored_once():
    # weight fusion off: it would fold each layer's gate into that layer's weight
    ep = export(Block(), (torch.randn(2, 8, 8),))
    result = fold(ep, FoldPolicy(fuse_into_weights=False))
    report = result.report
    exps = [d for d in report.decisions if d.target == "aten.exp.default"]
    assert len(exps) == 2 and all(d.folded for d in exps)
    assert exps[0].lifted_as == exps[1].lifted_as
    (gate,) = [c for c in report.lifted if set(c.replaces) == {d.node for d in exps}]
    assert not gate.reused and gate.shape == (8,)
    assert len({c.target for c in report.lifted}) == len(report.lifted)
    stored_gate = [k for k, v in result.program.constants.items() if v.shape == (8,)]
    assert len(stored_gate) == 1
    assert_same_outputs(ep, result.program, (torch.randn(2, 8, 8),))


@pytest.mark.parametrize("make", [
    lambda p: p.select(2, 1).clone(),  # the example: (1, 1) with strides (2, 2)
    lambda p: p.transpose(0, 2).clone(),  # (2, 1, 1) with strides (1, 2, 2)
    lambda p: p[..., :1].clone() * 1.0,
])
def test_identical_strided_values_are_hashed_and_stored_once(make):
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
    # the two sums of one strided copy hold identical bytes: one lifted constant for both
    (lifted,) = result.report.lifted
    assert len(lifted.replaces) == 2 and not lifted.reused, lifted
    assert len(result.program.constants) == 1


# Reading as few bytes as the rule can ------------------------------------------------------


def _digests(work) -> dict:
    """Digests per tensor id counted in `work` (`folding.work_counts`)."""
    return {key[1]: n for key, n in work.items() if isinstance(key, tuple) and key[0] == "dedup.digests"}


def test_distinct_weights_are_never_digested_in_a_fold():
    ep = torch.export.export(Layers().eval(), (torch.randn(2, 64),))
    with fold_scope(), counting() as work:  # the fold's own scope shares this memo
        result = fold_constants(ep)
    assert work["dedup.digested_bytes"] == 0, f"digested {len(_digests(work))} tensors ({work['dedup.digested_bytes']} bytes)"
    assert work["dedup.fingerprints"] > 0
    assert_report_bytes_true(result)


def test_identical_weights_are_read_whole_once_per_fold():
    """Three identical 16 KiB buffers collide on their fingerprints: each is compared with the
    first once in the fold (the indexes of the fold meet them several times), nothing more."""
    ep = torch.export.export(IdenticalCopies(), (torch.randn(4096),))
    with fold_scope(), counting() as work:
        result = fold_constants(ep)
    assert not _digests(work) and 0 < work["dedup.compared_bytes"] <= 2 * (2 * 4096 * 4)
    assert_report_bytes_true(result)
    assert result.report.constant_bytes_before == aligned(4096 * 4)


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_many_groups_sharing_a_fingerprint_are_digested_once_each(groups):
    """Seeded contents that differ only where no byte is sampled: up to two groups per
    fingerprint are told apart by comparisons; beyond, each tensor is digested at most once
    (no comparison per pair), and the grouping is exact either way."""
    g = torch.Generator().manual_seed(groups)
    base = torch.zeros(8192, dtype=torch.uint8)
    unsampled = [i for i in range(1, 8192) if i not in set(dedup._positions(8192).tolist())]
    contents = []
    for k in range(groups):
        t = base.clone()
        t[unsampled[int(torch.randint(0, len(unsampled), (1,), generator=g))]] = k + 1
        contents.append(t)
    tensors = [c.clone() for c in contents for _ in range(3)]  # 3 copies of each content
    with fold_scope(), counting() as work:
        index = IdenticalBytes()
        ids = [index.add(t) for t in tensors]
    assert ids == [i // 3 for i in range(len(tensors))]
    assert distinct_bytes(tensors) == groups * 8192
    if groups <= dedup._COMPARED_GROUPS:
        assert not _digests(work)
    else:
        assert _digests(work) and max(_digests(work).values()) == 1


def test_views_of_one_storage_are_identical_without_reading():
    w = torch.randn(300, 7)
    with fold_scope(), counting() as work:
        index = IdenticalBytes()
        groups = {index.add(w), index.add(w.view(300, 7)), index.add(w[:])}
    assert len(groups) == 1 and work["dedup.fingerprints"] == 1  # only the first is fingerprinted


def test_same_bytes_in_another_dtype_or_shape_are_stored_once():
    """The emitter keys buffers by their bytes alone (``hashlib.sha256(buffer_data)``)."""
    index = IdenticalBytes()
    small = {index.add(torch.zeros(8)), index.add(torch.zeros(32, dtype=torch.uint8))}
    large = {index.add(torch.zeros(1024)), index.add(torch.zeros(2, 1024, dtype=torch.int16))}
    assert len(small) == 1 and len(large) == 1 and small != large


def test_tensors_differing_only_where_no_byte_is_sampled_are_told_apart():
    a = torch.zeros(4096, dtype=torch.uint8)
    b = a.clone()
    b[1] = 1
    assert dedup._sampled_bytes(a) == dedup._sampled_bytes(b)  # the fingerprints collide
    index = IdenticalBytes()
    assert index.add(a) != index.add(b)
    assert distinct_bytes([a, b]) == 2 * 4096


def test_a_transposed_view_of_one_storage_holds_other_bytes():
    w = torch.randn(40, 50)
    index = IdenticalBytes()
    assert index.add(w) != index.add(w.t())
    assert index.add(w.t()) == index.add(w.t().contiguous())  # sampled in place, row-major
    assert index.add(w[:, ::2]) == index.add(w[:, ::2].clone())


def test_an_in_place_write_within_a_fold_invalidates_what_was_read():
    a, b = torch.ones(1024), torch.ones(1024)
    with fold_scope():
        first = IdenticalBytes()
        assert first.add(a) == first.add(b)
        b[700] = 2.0
        second = IdenticalBytes()
        assert second.add(a) != second.add(b)


class NothingToFold(nn.Module):
    """Every weight is read at runtime only: a fold stores nothing new and drops nothing."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(32, 32) for _ in range(4)))
        self.register_buffer("scale", torch.rand(32) + 0.5)

    def forward(self, x):
        return self.layers(x).relu() * self.scale  # relu: nothing to fuse the scale into


def test_a_stored_tensor_is_classified_once_per_fold():
    """The bytes before and after a fold, the placeholder savings and the reuse of stored
    tensors all group the same stored tensors: each is classified (`_Memo.content_class`) once
    in the fold, and the counts are the serialized bytes (`assert_report_bytes_true`)."""
    ep = torch.export.export(NothingToFold().eval(), (torch.randn(3, 32),))
    with fold_scope(), counting() as work:
        result = fold_constants(ep)
    assert not result.report.folded and not result.report.lifted
    stored = {id(t) for t in (*ep.state_dict.values(), *ep.constants.values())}
    assert work["dedup.classified"] == len(stored), work
    assert_report_bytes_true(result)


def test_a_tensor_is_classified_again_after_an_in_place_write():
    a, b = torch.ones(1024), torch.ones(1024)
    with fold_scope(), counting() as work:
        assert distinct_bytes([a, b]) == aligned(4096)
        assert distinct_bytes([a, b]) == aligned(4096) and work["dedup.classified"] == 2
        b[3] = 2.0
        assert distinct_bytes([a, b]) == 2 * aligned(4096) and work["dedup.classified"] == 3
        a[3] = 2.0  # a's first class holds nothing live now: a joins b's
        assert distinct_bytes([a, b]) == aligned(4096) and work["dedup.classified"] == 4


def test_a_class_outlives_its_first_tensor():
    """A class whose first tensor died is still found through a live member; a new tensor at
    a dead tensor's address is not taken for it."""
    with fold_scope():
        index = IdenticalBytes()
        first, second = torch.arange(4096.0), torch.arange(4096.0)
        g = index.add(first)
        assert index.add(second) == g
        del index, first
        later = IdenticalBytes()
        assert later.add(torch.arange(4096.0)) == later.add(second)
        assert later.add(torch.zeros(4096)) != later.add(second)


@pytest.mark.parametrize("n", [4, 400])  # all bytes in the fingerprint; sampled
def test_a_lazy_conjugate_holds_its_values_not_its_storage(n):
    """``x.conj()`` views `x`'s storage with the conjugate bit set: the serializer stores its
    values, so it is identical to its resolved copy, not to `x`."""
    x = torch.randn(n, dtype=torch.complex64)
    with fold_scope():
        index = IdenticalBytes()
        gx, gc, gr = index.add(x), index.add(x.conj()), index.add(x.conj().resolve_conj())
        assert gc == gr != gx
        assert index.add(-x) == index.add(x._neg_view())


def test_meta_tensors_are_never_identical():
    index = IdenticalBytes()
    assert index.add(torch.empty(8, device="meta")) != index.add(torch.empty(8, device="meta"))


def test_a_stored_tensor_is_reused_only_with_the_same_dtype_and_shape():
    stored = torch.zeros(4, 4)
    found = IdenticalTensors({"p": stored})
    assert found.find(torch.zeros(4, 4)) == "p"
    assert found.find(torch.zeros(16)) is None
    assert found.find(torch.zeros(4, 4, dtype=torch.int32)) is None
    assert found.find(torch.ones(4, 4)) is None


def test_tied_weights_save_nothing_when_one_name_goes():
    """Dropping one name of a tied Parameter saves no byte: the other still stores them."""
    ep = torch.export.export(Layers().eval(), (torch.randn(2, 64),))
    saving = {n.name: b for n, b in placeholder_savings(ep.graph, ep).items()}
    assert saving["p_tied_weight"] == saving["p_tied_again_weight"] == 0
    assert saving["p_layers_0_weight"] == aligned(64 * 64 * 4)
