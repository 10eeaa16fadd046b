"""What one attempt teaches the next (`folding.constraints`): the growth budget tightened by
the measured excess and cut to nothing after a second miss, learnt alias classes and undeclared
writes following their nodes to a fresh copy, and attempts redone on a working copy that lift
edits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import fold_constants
from folding.constraints import Constraints, KeepAliasClass, UndeclaredWrite
from folding.reasons import Reason


from hypothesis import given, settings, strategies as st


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 1 << 20), before=st.integers(0, 1 << 24),
       growths=st.lists(st.integers(-(1 << 20), 1 << 22), min_size=1, max_size=6))
def test_the_budget_is_cut_by_the_excess_then_to_nothing(budget, before, growths):
    """The fixpoint loop's budget rule: a lifted program within the allowance (budget less the
    cut) is accepted; one above it raises the cut by its excess; the second miss leaves no
    budget at all, after which every plan is final. So at most two attempts are redone for bytes."""
    c = Constraints()
    redone = 0
    for growth in growths:
        allowance = budget - c.budget_cut
        fits = c.fits(budget, before, before + growth)
        assert fits == (allowance < 0 or growth <= allowance)
        cut_before = c.budget_cut
        assert c.tighten_if_over_budget(budget, before, before + growth) is (not fits)
        if fits:
            assert c.budget_cut == cut_before  # a question that fits changes nothing
            continue
        redone += 1
        assert c.budget_misses == redone
        if redone == 1:
            assert c.budget_cut == growth - budget  # the planner's allowance drops by the excess
        else:
            assert c.budget_cut == budget + 1  # nothing left to plan with: the next plan is final
    assert redone <= 2


def test_no_budget_never_redoes_an_attempt():
    c = Constraints()
    assert c.fits(None, 0, 1 << 40) and not c.tighten_if_over_budget(None, 0, 1 << 40)
    assert (c.budget_cut, c.budget_misses) == (0, 0)


def _graph(names):
    g = torch.fx.Graph()
    return g, {name: g.placeholder(name) for name in names}


def test_learnt_constraints_keep_an_alias_class_whole_and_follow_names_to_a_copy():
    g, n = _graph(["root", "view", "add_", "other", "w", "op"])
    alias_root = {n["view"]: n["root"], n["add_"]: n["root"], n["other"]: n["other"]}
    c = Constraints()
    c.learn(KeepAliasClass(n["root"], Reason.EVALUATION_ERROR, "boom"), alias_root)
    c.learn(UndeclaredWrite(n["op"], n["w"]), alias_root)
    assert set(c.forced) == {n["root"], n["view"], n["add_"]}  # the class, not its neighbour
    assert all(why == (Reason.EVALUATION_ERROR, "boom") for why in c.forced.values())
    assert c.writes == {n["op"]: {n["w"]}}

    copy_graph, m = _graph(["root", "view", "add_", "other", "w", "op"])
    c.rebound(copy_graph)
    assert set(c.forced) == {m["root"], m["view"], m["add_"]} and c.writes == {m["op"]: {m["w"]}}
    with pytest.raises(TypeError, match="not a constraint"):
        c.learn("a write", alias_root)


class WriterBudgetAndBranches(nn.Module):
    """Attempts redone on the working program (the ``cond`` makes prepare copy it, and `lift`
    reads it to build the folded graph): an undeclared write found by evaluation (a constraint on a
    node, attempt redone before lift), a moved node kept at runtime (the fold reruns with it
    pinned in its body), and two identical buffers (stored once) folded into two results."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))
        self.register_buffer("c", torch.arange(3.0))
        self.register_buffer("a", torch.ones(256))
        self.register_buffer("b", torch.ones(256))
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        bumped = torch.ops.fold_test.sneaky_bump(self.state, self.c)
        z = torch.cond(y.sum() > 0, lambda y, w: y + w * 2, lambda y, w: y - w.exp(), (y, self.w))
        return x[:3] + bumped, self.state * 10.0, x + self.a * 2.0, x + self.b * 3.0, z


@pytest.mark.parametrize("strict", [True, False])
def test_attempts_redone_on_the_working_program_fold_right(strict):
    from folding import FoldPolicy
    from folding.reasons import Reason
    from tests.invariants import assert_caller_unchanged, assert_valid_program, caller_snapshot

    import copy

    x, y = torch.randn(256), torch.randn(4)
    model = WriterBudgetAndBranches()
    ep = torch.export.export(copy.deepcopy(model), (x, y))
    before = caller_snapshot(ep)
    result = fold_constants(ep, FoldPolicy.strict() if strict else FoldPolicy())
    assert_caller_unchanged(before, ep)
    assert_valid_program(result.program)
    report = result.report
    assert report.timings.get("reruns", 0) > 0
    assert report.constant_bytes_after <= report.constant_bytes_before + (0 if strict else FoldPolicy().growth_budget(
        report.constant_bytes_before))
    kept = {d.node: d.reason for d in report.decisions}
    assert kept["mul"] is Reason.READS_MUTATED_BUFFER  # the learnt write survived the fresh copy
    eager, folded = copy.deepcopy(model), result.program.module()  # the write bumps the state per call
    for flip in (1.0, -1.0):
        inputs = (x, y * flip)
        want, got = eager(*inputs), folded(*inputs)
        for w, g in zip(want, got):
            assert torch.allclose(w, g, atol=1e-6 * max(1.0, float(w.detach().abs().max())))
