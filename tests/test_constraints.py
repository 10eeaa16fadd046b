"""What one attempt teaches the next (`folding.fold.Constraints`): the growth budget tightened by
the measured excess and cut to nothing after a second miss, ops kept by evaluation forced once,
undeclared writes learnt, and attempts redone on a working copy that lift reads.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import FoldPolicy, fold_constants
from folding.core.evaluate import UndeclaredWrite
from folding.fold import Constraints
from folding.reasons import Reason
from tests.fold_checks import assert_fold_invariants, decision
from tests.invariants import assert_same_outputs


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


def test_a_learnt_write_is_recorded_per_op():
    g, n = _graph(["op", "w", "v"])
    c = Constraints()
    c.learn(UndeclaredWrite(n["op"], n["w"]))
    c.learn(UndeclaredWrite(n["op"], n["v"], aliased=True))
    assert c.writes == {n["op"]: {n["w"], n["v"]}} and not c.forced


class WriterBudgetAndBranches(nn.Module):
    """Attempts redone on the working program (the ``cond`` makes prepare copy it, and `lift`
    reads it to build the folded graph): an undeclared write found by evaluation (a constraint on a
    node, attempt redone before lift), code moved out of the branches, and two identical buffers
    (stored once) folded into two results."""

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


# An op the plan folded but evaluation kept: the size limits count what it keeps -------------

_ARMED = {"on": False}  # a kernel that cannot run at fold time (a device only the runtime has)


@torch.library.custom_op("fold_constraints_test::device_sum", mutates_args=())
def _device_sum(x: torch.Tensor) -> torch.Tensor:
    if _ARMED["on"]:
        raise RuntimeError("device_sum: no device at fold time")
    return x.sum(0, keepdim=True)


@_device_sum.register_fake
def _(x):
    return x.new_empty((1,) + tuple(x.shape[1:]))


class RaisesOnAFoldedTable(nn.Module):
    """The op that raises reads a large folded table (64 rows, 4 KiB), and a dead node the
    export keeps reads it with another one (issue 52, fuzz case 52052156200: a ``view`` that
    raised and the dead ``cat``/``gather`` reading it): the plan, which meant to fold them all,
    dropped the weights and stored only the output's few bytes."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(16, generator=g))
        self.v = nn.Parameter(torch.randn(16, generator=g))

    def forward(self, x):
        s = torch.ops.fold_constraints_test.device_sum(self.w.repeat(64, 1))
        unused = torch.cat([s, self.v.repeat(64, 1)])  # dead; torch.export keeps it  # noqa: F841
        return x + s + self.w * 2


def _fold_armed(ep, policy):
    _ARMED["on"] = True
    try:
        return fold_constants(ep, policy)
    finally:
        _ARMED["on"] = False


_TIGHT = [
    FoldPolicy(max_tensor_bytes=None, max_growth_bytes=64, max_growth_fraction=None),
    FoldPolicy(max_tensor_bytes=1024, max_growth_bytes=None, max_growth_fraction=None),
    FoldPolicy.strict(),
]


@pytest.mark.parametrize("policy", _TIGHT, ids=["budget", "cap", "strict"])
@pytest.mark.parametrize("seed", range(2))
def test_an_op_that_raises_at_fold_time_is_planned_with_the_size_limits(policy, seed):
    """Evaluation keeps an op that raised and stores its folded inputs in its place; the plan
    had counted them released and their weights dropped. Before the fix the fold stored the
    4 KiB tables (64 -> 4,224 bytes) against a 64-byte budget, a 1 KiB cap and no growth at
    all (the budget cut could not help: the plan never saw them). The op is forced and the
    attempt redone (`Constraints.keep_failed`)."""
    model = RaisesOnAFoldedTable(seed).eval()
    ep = torch.export.export(model, (torch.randn(1, 16),))
    result = _fold_armed(ep, policy)
    assert_fold_invariants(ep, result)
    report = result.report
    assert decision(report, "device_sum").reason is Reason.EVALUATION_ERROR
    assert decision(report, "cat").reason is Reason.DEPENDS_ON_KEPT
    budget = policy.growth_budget(report.constant_bytes_before)
    assert budget is None or report.constant_bytes_after - report.constant_bytes_before <= budget
    cap = policy.max_tensor_bytes
    assert cap is None or all(c.nbytes <= cap for c in report.lifted if not (c.reused or c.moved))
    assert report.timings.get("reruns", 0) > 0
    assert decision(report, "mul").folded or budget is not None and budget < 64  # what fits still folds
    g = torch.Generator().manual_seed(100 + seed)
    for _ in range(2):
        assert_same_outputs(ep, result.program, (torch.randn(1, 16, generator=g),))


class RaisesInABranchNeverTaken(nn.Module):
    """Code hoisted out of a ``cond`` branch that is never taken raises when evaluated (an index
    out of range), reading a large folded table: it is kept (the attempt redone, so the plan counts
    its inputs) and goes back into its branch (`bodies.sink_kept_code`), where it never runs."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(16, generator=g))
        self.register_buffer("row", torch.tensor([70]))  # 64 rows

    def forward(self, x):
        def taken(x, w, row):
            return x + w * 2

        def never(x, w, row):
            return x + w.repeat(64, 1).index_select(0, row)

        return torch.cond(x.abs().sum() >= 0, taken, never, (x, self.w, self.row))


@pytest.mark.parametrize("policy", _TIGHT, ids=["budget", "cap", "strict"])
def test_an_op_that_raises_in_an_untaken_branch_goes_back_within_the_size_limits(policy):
    ep = torch.export.export(RaisesInABranchNeverTaken(0).eval(), (torch.randn(1, 16),))
    result = fold_constants(ep, policy)
    assert_fold_invariants(ep, result)
    report = result.report
    assert decision(report, "cond.false_graph_0/index_select").reason in (Reason.EVALUATION_ERROR, Reason.GROWTH_BUDGET)
    budget = policy.growth_budget(report.constant_bytes_before)
    assert budget is None or report.constant_bytes_after - report.constant_bytes_before <= budget
    cap = policy.max_tensor_bytes
    assert cap is None or all(c.nbytes <= cap for c in report.lifted if not (c.reused or c.moved))
    assert_same_outputs(ep, result.program, (torch.randn(1, 16),))


def test_ops_kept_by_evaluation_are_forced_once_and_their_readers_left_to_the_analysis():
    g, n = _graph(["raised", "tuple", "reader", "forced"])
    c = Constraints()
    c.forced[n["forced"]] = (Reason.EVALUATION_ERROR, "earlier")
    kept = {n["raised"]: (Reason.EVALUATION_ERROR, "RuntimeError: boom"), n["tuple"]: (Reason.NOT_A_TENSOR, "list"),
            n["reader"]: (Reason.DEPENDS_ON_KEPT, "raised: EVALUATION_ERROR"),
            n["forced"]: (Reason.EVALUATION_ERROR, "again")}
    assert c.keep_failed(kept)
    assert c.forced == {n["forced"]: (Reason.EVALUATION_ERROR, "earlier"), n["raised"]: kept[n["raised"]],
                        n["tuple"]: kept[n["tuple"]]}
    assert not c.keep_failed(kept) and not c.keep_failed({})  # nothing new: the attempt stands
