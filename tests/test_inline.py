"""A ``cond`` whose predicate became a constant is replaced by the branch it takes
(`folding/inline.py`, `Inlining`), and the inlining touches nothing of the caller's.

The inlined nodes get names of their own: they never reuse a name of the caller's program (the
report names the caller's nodes, including those the first fold folded), and a node of the
caller's that torch.export left unused is not dropped. Inlining never runs torch's
``Graph.eliminate_dead_code`` on a graph whose bodies are the caller's: that recompiles, in
place, every body a get_attr reads, so a region of the caller's with an unused result lost its
code. Every program goes through `control_flow_checks.fold_and_compare`, which snapshots every
GraphModule of the caller's program (graph and code) before and after. Found by the
control-flow fuzzer (shrunk), siblings of issue 21's faults."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.while_loop import while_loop

from tests.control_flow_checks import fold_and_compare

X = torch.randn(4)
BOTH = [(X.abs() + 0.1,), (-X.abs() - 0.1,)]  # x.sum() > 0, then not


# Inlining a constant-predicate cond after the first fold must not reuse the caller's names (the
# report names the caller's nodes), nor drop a node of the caller that torch.export left unused.

class InlinedNameOfAFoldedNode(nn.Module):
    """`add` (constant, folded in the first fold) and the taken branch's own `add`."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        y = torch.cond(self.flag, lambda x, a: ((x + a) * a,), lambda x, a: (x - a,), (x, self.w))[0]
        return y + ((torch.arange(4) % 2 == 0).float() + self.w * 0)


class UnusedGetitemBesideAConstantCond(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        y = torch.cond(self.flag, lambda x, a: (x + a,), lambda x, a: (x - a,), (x, self.w))[0]
        i, acc = while_loop(lambda i, acc: i < 2, lambda i, acc: (i + 1, acc * 0.5), (torch.zeros((), dtype=torch.int64), y))
        return acc  # the loop counter's getitem is left without users by torch.export


@pytest.mark.parametrize("make", [InlinedNameOfAFoldedNode, UnusedGetitemBesideAConstantCond],
                         ids=["folded_name", "unused_getitem"])
def test_inlining_a_constant_cond_keeps_the_callers_names(make):
    ep, result = fold_and_compare(make(), BOTH, pte=False, one_branch={"cond"})
    names = {n.name for n in result.program.graph.nodes}
    folded = {d.node for d in result.report.decisions if d.folded and "/" not in d.node}
    assert not names & folded, names & folded


# Inlining a cond with a constant predicate ran torch's `Graph.eliminate_dead_code` on the fold's
# root graph, which also dead-code-eliminates and recompiles, in place, every body a get_attr
# reads: a region or branch of the caller's with an unused result lost its code (fuzzer kinds
# ``aten: caller-changed`` and ``aten: dead-leftovers``).

class _UnusedRegionBesideAConstantCond(nn.Module):
    def __init__(self, region: str):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.region = region

    def forward(self, x):
        if self.region == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                unused = x @ x.t()  # noqa: F841 (dead code of the caller's own region)
        else:
            with torch.no_grad():
                unused = x * 3.0  # noqa: F841
        return torch.cond(self.w.sum() > 0, lambda a: (torch.sigmoid(a - 1.0),), lambda a: (a * 2.0,), (x,))[0]


@pytest.mark.parametrize("region", ["autocast", "no_grad"])
def test_inlining_beside_an_unused_region_leaves_the_callers_bodies_alone(region):
    """`fold_and_compare` snapshots every GraphModule of the caller's program (graph and code)."""
    fold_and_compare(_UnusedRegionBesideAConstantCond(region), [(torch.randn(3, 4),)], pte=False,
                     one_branch={"cond"})
