"""The analysis stage (`folding.core.analysis`): which values are constant, and why the others are
not. A random op is never constant (`Reason.RANDOM`: it draws from the RNG at runtime), nor is
an op whose target the policy skips (`Reason.SKIPPED_TARGET`); what reads either stays with it
(`Reason.DEPENDS_ON_KEPT`). Checked on real ATen and Edge programs, by value."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folding import FoldPolicy, Reason
from tests.fold_checks import call_targets, decision, decisions_for, edge, export, fold
from tests.invariants import assert_same_outputs


# Random ops ----------------------------------------------------------------------------------


class Noisy(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        scale = self.w.exp()
        if self.kind == "rand":
            noise = torch.rand(4, 4)
        elif self.kind == "randn_like":
            noise = torch.randn_like(self.w)
        elif self.kind == "dropout":
            noise = F.dropout(self.w, 0.5, training=True)
        else:  # in-place random fill of a fresh constant
            noise = torch.empty(4, 4).uniform_()
        return x + (noise * scale).sum(0)


RANDOM_TARGETS = {
    "rand": "aten.rand.default",
    "randn_like": "aten.randn_like.default",
    "dropout": "aten.dropout.default",
    "uniform_": "aten.uniform_.default",
}


@pytest.mark.parametrize("kind, dialect", [(kind, "aten") for kind in sorted(RANDOM_TARGETS)] + [("rand", "edge")])
def test_random_op_is_not_folded_nor_anything_downstream(kind, dialect):
    ep = export(Noisy(kind), (torch.randn(4),))
    if dialect == "edge":
        ep = edge(ep)
    result = fold(ep)
    report = result.report
    (rnd,) = decisions_for(report, RANDOM_TARGETS[kind])
    assert not rnd.folded
    if kind == "uniform_":  # the random fill keeps its whole allocation class
        alloc = decision(report, "empty")
        assert alloc.reason is Reason.MUTATED_BY_RUNTIME_OP and "uniform_" in alloc.detail
        assert rnd.reason in (Reason.RANDOM, Reason.DEPENDS_ON_KEPT)
    else:
        assert rnd.reason is Reason.RANDOM
    assert RANDOM_TARGETS[kind] in call_targets(result.program)
    mul = decisions_for(report, "aten.mul.Tensor")[0]
    assert mul.reason is Reason.DEPENDS_ON_KEPT and not mul.folded
    (exp,) = decisions_for(report, "aten.exp.default")
    assert exp.folded and exp.lifted_as  # read by the kept mul

    x = torch.randn(4)
    torch.manual_seed(0)
    want = ep.module()(x)
    torch.manual_seed(0)
    got = result.program.module()(x)
    torch.testing.assert_close(got, want)
    # Not baked into a constant: a second draw differs.
    assert not torch.equal(result.program.module()(x), got)


# policy.skip_targets ------------------------------------------------------------------------


class ExpChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x + (self.w * 0.5).exp().sum(0)


SKIP_FORMS = {
    "overload": torch.ops.aten.exp.default,
    "packet": torch.ops.aten.exp,
    "overload-name": "aten.exp.default",
    "packet-name": "aten.exp",
}


@pytest.mark.parametrize(
    "form, dialect", [(form, "aten") for form in sorted(SKIP_FORMS)] + [("overload", "edge"), ("packet-name", "edge")]
)
def test_skip_targets_keeps_the_op_with_skipped_target(form, dialect):
    ep = export(ExpChain(), (torch.randn(4),))
    if dialect == "edge":
        ep = edge(ep)
    result = fold(ep, FoldPolicy(skip_targets={SKIP_FORMS[form]}))
    (exp,) = decisions_for(result.report, "aten.exp.default")
    assert exp.reason is Reason.SKIPPED_TARGET
    assert "aten.exp.default" in call_targets(result.program)
    (mul,) = decisions_for(result.report, "aten.mul.Tensor")
    assert mul.folded and mul.lifted_as  # its input is folded and stored
    (total,) = decisions_for(result.report, "aten.sum.dim_IntList")
    assert total.reason is Reason.DEPENDS_ON_KEPT
    assert_same_outputs(ep, result.program, (torch.randn(4),))


def test_without_skip_targets_the_same_op_folds():
    ep = export(ExpChain(), (torch.randn(4),))
    result = fold(ep)
    (exp,) = decisions_for(result.report, "aten.exp.default")
    assert exp.folded and "aten.exp.default" not in call_targets(result.program)
