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
    assert 0 < row.constant_prop_pass_s < row.deepcopy_constant_prop_pass_s  # the copy is timed
    assert row.fold_constants_s == pytest.approx(row.fold_aten_s + row.fold_edge_s)
    assert row.ratio_copy == pytest.approx(row.deepcopy_constant_prop_pass_s / row.fold_constants_s)
    assert row.ratio_inplace == pytest.approx(row.constant_prop_pass_s / row.fold_inplace_s)
    assert row.floor_s > 0 and row.aten_nodes < row.edge_nodes


def test_table_has_one_cell_per_column(row):
    header, rule, line = fold_time.table([row]).splitlines()
    assert header.count("|") == rule.count("|") == line.count("|")
    assert line.startswith("| llama |")
