"""Mutation: buffers the program updates are runtime state, never folded (torch 2.14's training
IR keeps ``add_``/``copy_`` in the graph and does not list the buffer in
``buffers_to_mutate``); in-place updates of fresh constants fold only when nothing at runtime
reads or writes them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folding import Reason
from tests.fold_checks import call_targets, decision, export, fold, reference
from tests.invariants import assert_close_all
from tests.invariants import outputs


class MutatedBufferLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(4, 4))
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        self.buf.add_(1)
        return F.linear(x, F.linear(self.buf, self.w)) + self.w.t().sum()


def _two_calls_match(ref, folded, inputs_seq):
    """Run both programs' modules on the same sequence of inputs; their buffers evolve alike."""
    m_ref, m_fold = ref.module(), folded.module()
    got_first = None
    for inputs in inputs_seq:
        want, got = m_ref(*inputs), m_fold(*inputs)
        assert_close_all([want], [got])
        got_first = got if got_first is None else got_first
    return got_first


@pytest.mark.parametrize("ir", ["training", "functional"])
def test_mutated_buffer_read_by_linear_is_not_folded(ir):
    ep = export(MutatedBufferLinear(), (torch.randn(2, 4),))
    if ir == "functional":
        ep = ep.run_decompositions({})
        assert "buf" in ep.graph_signature.buffers_to_mutate.values()
    else:
        assert not ep.graph_signature.buffers_to_mutate  # the trap: only add_ says so
    ref = reference(ep)
    result = fold(ep)
    report = result.report
    (update,) = [n for n in ep.graph.nodes if n.op == "call_function" and any(i.name == "b_buf" for i in n.all_input_nodes)]
    assert decision(report, update.name).reason is Reason.READS_MUTATED_BUFFER
    inner = decision(report, "linear")  # F.linear(self.buf, self.w): reads only stored tensors
    assert inner.reason in (Reason.READS_MUTATED_BUFFER, Reason.DEPENDS_ON_KEPT), inner
    assert decision(report, "t").folded  # the unrelated constant part still folds
    assert "b_buf" in {n.name for n in result.program.graph.nodes}
    x = torch.randn(2, 4)
    first = _two_calls_match(ref, result.program, [(x,), (x,)])
    assert not torch.allclose(first, result.program.module()(x))  # the state really advances


def test_mutated_buffer_program_pte_matches_over_two_calls():
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    from tests.lowering import lower_pte

    ep = export(MutatedBufferLinear(), (torch.randn(2, 4),))
    ref = reference(ep)
    result = fold(ep)
    # Serialise the buffer's initial value (by default a mutated buffer starts uninitialised).
    buffer = lower_pte(result.program, "portable", mutated_buffers=["buf"])
    method = _load_for_executorch_from_buffer(buffer)  # keeps reading `buffer`: hold it
    m_ref = ref.module()
    x = torch.randn(2, 4)
    results = []
    for _ in range(2):
        (got,) = method.forward((x,))
        assert_close_all(m_ref(x), got, 1e-4, 1e-4)
        results.append(got.clone())
    assert not torch.allclose(results[0], results[1])


class BufferReadBeforeUpdate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        before = self.count * 2 + 1  # reads only a buffer, but one that changes every call
        self.count.add_(1)
        return x + before + self.count


def test_buffer_read_before_its_update_is_not_folded():
    ep = export(BufferReadBeforeUpdate(), (torch.randn(4),))
    ref = reference(ep)
    result = fold(ep)
    assert decision(result.report, "mul").reason is Reason.READS_MUTATED_BUFFER
    assert not result.report.folded
    _two_calls_match(ref, result.program, [(torch.randn(4),), (torch.randn(4),)])


class SliceAssignedBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 4))
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        self.cache[:2] = x[:2]  # copy_ into a slice: mutates the buffer through a view
        return self.cache.t() * 2 + self.w.exp()


def test_buffer_mutated_through_a_slice_is_not_folded():
    ep = export(SliceAssignedBuffer(), (torch.randn(4, 4),))
    ref = reference(ep)
    result = fold(ep)
    t = decision(result.report, "t")
    assert t.reason is Reason.READS_MUTATED_BUFFER
    assert decision(result.report, "exp").folded
    assert "aten.t.default" in call_targets(result.program)
    _two_calls_match(ref, result.program, [(torch.randn(4, 4),), (torch.randn(4, 4),)])


class FreshConstantUpdates(torch.nn.Module):
    def forward(self, x):
        early = torch.zeros(4)
        y = x + early  # runtime read before the in-place update
        early.add_(1)
        by_input = torch.ones(4)
        by_input.mul_(x)  # updated in place by a runtime value
        folded = torch.zeros(4)
        folded.add_(3)
        folded.mul_(2)  # updated only by constants: folds
        return y + early, by_input, x * folded


def test_in_place_updates_of_fresh_constants_fold_only_when_nothing_at_runtime_touches_them():
    ep = export(FreshConstantUpdates(), (torch.randn(4),))
    result = fold(ep)
    report = result.report
    assert decision(report, "zeros").reason is Reason.MUTATED_AFTER_RUNTIME_READ
    assert decision(report, "ones").reason is Reason.MUTATED_BY_RUNTIME_OP
    for name in ("zeros_1", "add__1", "mul__1"):
        assert decision(report, name).folded, decision(report, name)
    (lifted,) = report.lifted  # the folded class is stored once, as its final value
    stored = result.program.constants[lifted.target]
    assert torch.equal(stored, torch.zeros(4).add_(3).mul_(2))
    x = torch.randn(4)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))


class UnmutatedBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.rand(4) + 0.5)
        self.register_buffer("shift", torch.randn(4), persistent=False)

    def forward(self, x):
        return x * self.scale.log() + self.shift.exp()


def test_unmutated_buffers_fold_and_are_removed_when_unused():
    ep = export(UnmutatedBuffers(), (torch.randn(4),))
    assert "shift" in ep.constants  # a non-persistent buffer lives in constants
    result = fold(ep)
    assert set(result.report.removed_placeholders) == {"b_scale", "b_shift"}
    assert "scale" not in result.program.state_dict and "shift" not in result.program.constants
    x = torch.randn(4)
    assert_close_all(outputs(ep, (x,)), outputs(result.program, (x,)))
