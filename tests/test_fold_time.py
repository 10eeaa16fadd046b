"""The fold-time benchmark (`benchmarks.fold_time`) on the quick llama (a tied embedding, so
the Edge stage reads it through its transpose): both pairings measured, every timed program
right. Speed is not asserted: the numbers depend on the machine and its load."""

from __future__ import annotations

import pytest

from benchmarks import fold_time


@pytest.fixture(scope="module")
def row():
    return fold_time.measure("llama", repeats=1, quick=True)


def test_every_timed_program_matches_eager(row):
    assert row.error_constant_prop_pass < 1e-5
    assert row.error_fold_constants < 1e-5  # the larger of the copying and the in-place fold


def test_both_pairings_are_reported_from_their_own_clocks(row):
    # both clocks ran; which is faster depends on the machine's load, so it is not asserted here
    assert row.constant_prop_pass_s > 0 and row.deepcopy_constant_prop_pass_s > 0
    assert row.fold_aten_s > 0 and row.fold_edge_s > 0 and row.fold_inplace_s > 0
    assert row.floor_s > 0 and row.aten_nodes < row.edge_nodes
    assert 0 <= row.bodies_inplace_s <= row.fold_inplace_s  # a part of the in-place fold's time


def test_table_has_one_cell_per_column(row):
    header, rule, line = fold_time.table([row]).splitlines()
    assert header.count("|") == rule.count("|") == line.count("|")
    assert line.startswith("| llama |")


def test_the_floor_copies_the_top_level_graph_and_each_body_the_fold_replaced(row):
    """llama has no body: one graph per stage. A cond whose branches lose their constant code
    has both bodies replaced; a program folded again with nothing to move keeps its top-level
    graph, and each body is a copy of its own (every body slot is copied up front, before
    hoisting: no copy-on-first-edit bookkeeping)."""
    import torch

    from folding import fold_constants
    from tests.programs import RewrittenAndHoisted

    assert row.edited_graphs == 2
    ep = torch.export.export(RewrittenAndHoisted().eval(), (torch.randint(0, 2048, (2, 7)), torch.tensor([1])))
    edited = fold_time.edited_graphs(ep, fold_constants(ep).program)
    assert edited[0] is ep.graph_module and {id(m) for m in edited[1:]} == {id(ep.graph_module.true_graph_0),
                                                                            id(ep.graph_module.false_graph_0)}
    # folded again, nothing moves: the top-level graph is the folded program's own, the bodies copies
    once = fold_constants(ep).program
    again = fold_time.edited_graphs(once, fold_constants(once).program)
    assert again[0] is once.graph_module and len(again) == 3, again
