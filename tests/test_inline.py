"""A ``cond`` whose predicate became a constant is replaced by the branch it takes
(`folding/control_flow/inline.py`, `Inlining`), and the inlining touches nothing of the caller's.

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

import folding
from tests.control_flow_checks import fold_and_compare, fold_checked
from tests.fold_checks import assert_same_over_calls, export, reference

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


# A cond whose predicate is a buffer the program writes is never inlined: in torch 2.14's
# training IR the write is an op on the buffer's placeholder (or a view of it), not a
# BUFFER_MUTATION output, so the signature alone calls the buffer unchanging and the cond was
# inlined with the buffer's first value (issue 52; `folding/core/unchanging.py`).

_lib = torch.library.Library("fold_inline_test", "DEF")
_lib.define("clear(Tensor flag, Tensor x) -> Tensor")  # writes `flag`, which it does not declare


def _clear(flag, x):
    flag.fill_(False)
    return x.clone()


_lib.impl("clear", _clear, "CompositeExplicitAutograd")
_lib.impl("clear", lambda flag, x: torch.empty_like(x), "Meta")


class PredicateWrittenInGraph(nn.Module):
    """``cond(self.first, ...)`` where `write` updates ``first`` in the graph: before or after the
    cond, directly, through a view, or by a custom op that does not declare the write."""

    def __init__(self, write: str):
        super().__init__()
        self.register_buffer("first", torch.tensor(True))
        self.write = write

    def forward(self, x):
        if self.write == "copy_before":
            self.first.copy_(x.sum() > 0)
        y = torch.cond(self.first, lambda x: x * 2.0, lambda x: x + 1.0, (x,))
        if self.write == "fill_after":
            self.first.fill_(False)
        elif self.write == "view_fill_after":
            self.first.unsqueeze(0).fill_(False)
        elif self.write == "logical_not_after":
            self.first.logical_not_()
        elif self.write == "custom_op_after":
            y = y + torch.ops.fold_inline_test.clear(self.first, x)
        return y


@pytest.mark.parametrize("write", ["fill_after", "view_fill_after", "logical_not_after", "copy_before",
                                   "custom_op_after"])
def test_a_predicate_the_graph_writes_is_not_inlined(write):
    x = (-X.abs() - 0.5) if write == "copy_before" else X.abs() + 0.5  # copy_: the flag flips on call 1
    ep = export(PredicateWrittenInGraph(write), (x,))
    assert not any(s.kind.name == "BUFFER_MUTATION" for s in ep.graph_signature.output_specs)  # training IR
    result = fold_checked(ep)
    assert_same_over_calls(ep, result.program, (x,))
    assert torch.ops.higher_order.cond in {n.target for n in result.program.graph.nodes}


def test_a_predicate_nothing_writes_is_still_inlined():
    """The same buffer, read only: the cond goes (the rule above keeps only written ones)."""
    ep = export(PredicateWrittenInGraph("none"), (X,))
    result = fold_checked(ep)
    assert torch.ops.higher_order.cond not in {n.target for n in result.program.graph.nodes}
    assert_same_over_calls(ep, result.program, (X,))


def test_qnn_control_flow_first_fold_keeps_a_written_predicate():
    """QNN's early fold of control flow (`qnn.control_flow.fold_control_flow_first`, in place)
    goes through the same inlining."""
    qnn_control_flow = pytest.importorskip("qnn.control_flow")
    ep = export(PredicateWrittenInGraph("fill_after"), (X.abs() + 0.5,))
    unfolded = reference(ep)
    assert qnn_control_flow.fold_control_flow_first(ep, folding.FoldPolicy()) is not None
    assert_same_over_calls(unfolded, ep, (X.abs() + 0.5,))
