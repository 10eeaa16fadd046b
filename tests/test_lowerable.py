"""Folding never makes a program that lowered fail to lower.

Two ways a fold could: a body that returns one constant in two places would return one
tensor twice, and HOP outputs may alias neither an operand nor each other; so each place a body
returns a moved value gets a copy of its own (`folding/control_flow/bodies.py`, in the dialect's copy op,
`folding/clones.py`). And a stored value returned as an output while an op a backend delegates
reads it is returned through a placeholder of its own and a copy (`folding/core/placement.py`,
`_own_placeholders`; the copy is `folding/core/lift.py`'s `_clone_outputs`); a buffer the program
writes is returned as written.

Every program here lowers unfolded (the premise: checked first for issue 21's program of each
rule, for the others when a folded path fails), then folded through each path
(`fold_constants` on the ATen program, `FoldConstantsPass` as a transform pass on the Edge
program), for the portable runtime and XNNPACK; each .pte runs and matches eager on inputs
taking each branch (`control_flow_checks.assert_lowers_folded_as_unfolded`). Found by issue 21
(fault 4)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.map import map as hop_map

from folding import FoldPolicy
from tests.control_flow_checks import assert_lowers_folded_as_unfolded, fold_checked
from tests.fold_checks import edge, export
from tests.invariants import assert_close_all
from tests.invariants import outputs
from tests.lowering import run_pte

POLICIES = [FoldPolicy(), FoldPolicy.strict()]


# A body returning one constant twice.

class BranchReturnsAConstantTwice(nn.Module):
    """One branch returns two copies of one constant (issue 21's program)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, a):
        def true_fn(a):
            c = self.w * 0.5
            return c.clone(), c.clone()

        return torch.cond(a.sum() > 0, true_fn, lambda a: (a.mean(0), a.sum(0)), (a,))


class BranchReturnsTwoEqualConstants(nn.Module):
    """Two different constants of identical bytes, returned by one branch."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, a):
        return torch.cond(a.sum() > 0, lambda a: (self.w * 2.0, self.w + self.w, a.sum(0)),
                          lambda a: (a.mean(0), a.sum(0), a.amax(0)), (a,))


class MapReturnsAConstantTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        def body(xi):
            c = self.w.exp()
            return xi + 1.0, c.clone(), c.clone()

        return hop_map(body, xs)


ROWS = torch.randn(3, 4)
BRANCHES = [(ROWS.abs() + 0.1,), (-ROWS.abs() - 0.1,)]


# the strict policy lowers the same bodies (the copies do not depend on the policy): slow tier
@pytest.mark.parametrize("policy", [POLICIES[0], pytest.param(POLICIES[1], marks=pytest.mark.slow)], ids=["default", "strict"])
@pytest.mark.parametrize("make", [BranchReturnsAConstantTwice, BranchReturnsTwoEqualConstants],
                         ids=["one_constant_twice", "two_equal_constants"])
def test_a_branch_returning_a_constant_twice_still_lowers_and_runs(make, policy):
    premise = make is BranchReturnsAConstantTwice and policy is POLICIES[0]  # one per rule: issue 21's program
    assert_lowers_folded_as_unfolded(make(), BRANCHES, policy=policy, premise=premise)


def test_a_map_body_returning_a_constant_twice_still_goes_to_edge():
    """executorch 1.5.1 emits no map with several outputs, so the check stops at `to_edge`
    (where functionalization checks the body's aliasing), with eager outputs compared."""
    ep = export(MapReturnsAConstantTwice(), (ROWS,))
    ref = copy.deepcopy(ep)
    edge(copy.deepcopy(ep))  # premise
    folded = edge(fold_checked(ep).program)
    assert_close_all(outputs(ref, (ROWS,)), outputs(folded, (ROWS,)))


def test_a_branch_of_an_edge_program_returning_a_constant_twice_gets_two_copies():
    """In Edge dialect, folded directly (the copies are the dialect's own clone op)."""
    from tests.invariants import edge_pte

    ep = edge(export(BranchReturnsAConstantTwice(), BRANCHES[0]))
    ref = copy.deepcopy(ep)
    folded = fold_checked(ep).program
    pte = edge_pte(folded)
    for x in BRANCHES:
        with torch.no_grad():  # to_edge lifted the body's scalar into a real tensor: no autograd trace
            want = outputs(ref, x)
        assert_close_all(want, run_pte(pte, x), atol=1e-4)


# A stored tensor returned as an output while a delegated op reads it.

class LinearBiasReturned(nn.Module):
    """The weight is computed from constants, the bias is returned (issue 21's program)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.p = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.b + self.b, self.p), self.p


class ConvWeightReturned(nn.Module):
    """XNNPACK's conv1d reshapes its weight in place: a copy of the shared placeholder would
    return 4-D data."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x):
        return F.conv1d(x, self.w, self.b * 2.0), self.w


class FoldedConvWeightReturned(nn.Module):
    """A folded conv1d weight that is also returned: XNNPACK's conv1d lowering makes the
    weight 4-D, and a clone reading the same placeholder would return 4-D data."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(4, 3, 3))

    def forward(self, x):
        w = self.b * 2.0
        return F.conv1d(x, w), w


class LinearBiasReturnedAsItsEqual(nn.Module):
    """A folded value with the bias's bytes, returned next to the bias."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.p = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.b + self.b, self.p), self.p * 1.0, self.p


class BufferReturnedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(6, 2))
        self.register_buffer("b", torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.w, self.b.exp()), self.w, self.w


RETURNED = {"linear_bias": (LinearBiasReturned, torch.randn(2, 2)),
            "conv1d_weight": (ConvWeightReturned, torch.randn(1, 3, 8)),
            "folded_conv1d_weight": (FoldedConvWeightReturned, torch.randn(1, 3, 8)),
            "stored_as_its_equal": (LinearBiasReturnedAsItsEqual, torch.randn(2, 2)),
            "buffer_twice": (BufferReturnedTwice, torch.randn(2, 2))}
# The strict policy (no growth) folds these three to the very program the default policy does
# (each folded value replaces the stored tensor it reads): slow tier. It keeps
# stored_as_its_equal's ``p * 1.0`` at runtime (growth), another program, in the default tier.
STRICT_FOLDS_THE_SAME = {"linear_bias", "conv1d_weight", "buffer_twice"}
# The strict policy keeps ``b * 2.0`` at runtime (growth): folded_conv1d_weight's strict row is
# another program.


@pytest.mark.parametrize("make, x, policy", [
    pytest.param(*RETURNED[name], policy, id=f"{name}-{policy_id}",
                 marks=pytest.mark.slow if policy_id == "strict" and name in STRICT_FOLDS_THE_SAME else ())
    for policy, policy_id in zip(POLICIES, ["default", "strict"]) for name in RETURNED])
def test_a_returned_parameter_read_by_a_folded_op_still_lowers_with_xnnpack(make, x, policy):
    premise = make is LinearBiasReturned and policy is POLICIES[0]  # one per rule: issue 21's program
    assert_lowers_folded_as_unfolded(make(), [(x,)], policy=policy, premise=premise)


def test_the_strict_policy_folds_the_slow_tiers_returned_parameter_programs_as_the_default_does():
    """What lets their strict lowering run in the slow tier only: the same graph, signature and
    stored values under either policy."""
    for name in sorted(STRICT_FOLDS_THE_SAME):
        make, x = RETURNED[name]
        ep = export(make().eval(), (x,))
        default, strict = (fold_checked(copy.deepcopy(ep), policy).program for policy in POLICIES)
        assert default.graph_module.code == strict.graph_module.code, name
        assert str(default.graph_signature) == str(strict.graph_signature), name
        stored = [{**p.state_dict, **p.constants} for p in (default, strict)]
        assert stored[0].keys() == stored[1].keys(), name
        assert all(torch.equal(stored[0][k], stored[1][k]) for k in stored[0]), name


class WrittenBufferReturned(nn.Module):
    """A buffer the program writes is returned as written, never as a stored copy."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.register_buffer("p", torch.zeros(6))

    def forward(self, x):
        y = F.linear(x, self.b + self.b, self.p)
        self.p.add_(1.0)
        return y, self.p


def test_a_returned_buffer_the_program_writes_is_returned_as_written():
    x = torch.randn(2, 2)
    ep = export(WrittenBufferReturned(), (x,))
    ref = copy.deepcopy(ep)
    folded = fold_checked(ep).program
    ref_module, folded_module = ref.module(), folded.module()
    for _ in range(2):  # the second call reads the written buffer
        assert_close_all(list(ref_module(x)), list(folded_module(x)))
