"""A report whose phases add up, and attempts redone on a working copy that lift edits.

The cost of the identical-bytes rule (`folding.dedup`), which does not grow with stored bytes,
is tested in test_dedup.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import fold_constants
from folding.report import PHASES
from tests.programs import IdenticalCopies, Layers, SneakyWriter


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x, w: x + w * 2, lambda x, w: x - w.exp(), (x, self.w))


@pytest.mark.parametrize("module, shape, rerun", [
    (Layers, (2, 64), False),
    (IdenticalCopies, (4096,), False),
    (Branches, (4,), False),
    (SneakyWriter, (3,), True),  # an undeclared write found by evaluation: one rerun
])
def test_phase_timings_add_up_to_the_total(module, shape, rerun):
    ep = torch.export.export(module().eval(), (torch.randn(*shape),))
    timings = fold_constants(ep).report.timings
    phases = {k: v for k, v in timings.items() if k != "total"}
    assert set(phases) <= set(PHASES) and all(v >= 0 for v in phases.values())
    assert {"checks", "bytes", "analysis", "planning", "evaluation", "lift", "report"} <= set(phases)
    assert ("reruns" in phases) is rerun
    # the phases cover the whole call: only a few statements between them are not timed
    assert abs(sum(phases.values()) - timings["total"]) <= 0.05 * timings["total"] + 0.002


class WriterBudgetAndBranches(nn.Module):
    """Attempts redone on a working copy that lift edits in place (the ``cond`` makes the fold
    work on a copy of its own): an undeclared write found by evaluation (a constraint on a
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
def test_attempts_redone_on_a_working_copy_lift_edits_fold_right(strict):
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
