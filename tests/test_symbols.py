"""Dynamic shapes: a value whose shape has a free symbol is never evaluated, and the report says
why; a size that export or ``to_edge`` specialised is an int.

`folding/core/symbols.py` tells a dynamic input's free symbols (``s77`` of ``Dim("b", min=2,
max=8)``), which only a runtime call fixes, from a specialised SymInt (a constant expression,
passed to kernels as an int: `concrete_ints`); `folding/core/analysis.py` keeps a value with free
symbols, or a fill shaped like such a value, at runtime with ``Reason.SYMBOLIC`` and a detail
naming the symbols. The folded program matches the unfolded one at several batch sizes, eagerly
and as a .pte lowered with `FoldConstantsPass`. Found by issue 21 (fault 6)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from folding import FoldConstantsPass
from tests.control_flow_checks import fold_checked
from tests.fold_checks import edge, export
from tests.invariants import assert_close_all
from tests.lowering import stock_lower_pte
from tests.invariants import outputs
from tests.lowering import run_pte

B = torch.export.Dim("b", min=2, max=8)


class FilledSliceOfADynamicInput(nn.Module):
    """Issue 21's program: no constants; its Edge decomposition fills a slice of the input
    (``full_like``)."""

    def forward(self, x):
        t = (x - 0.5).unsqueeze(3).flatten(2) + 0.0
        t[:, :, 0].fill_(0.25)
        return F.log_softmax(torch.split(t, 1, 1)[2], dim=1).triu(0)


def test_a_filled_slice_of_a_dynamic_input_folds_in_edge_dialect():
    """executorch's ``to_edge`` specialises this program's batch to 2 (its range constraints
    become ``{2: [2, 2]}``) but keeps SymInt objects of value 2 in the metadata: those are
    sizes, not free symbols, and evaluation passes them to kernels as ints."""
    x = torch.randn(2, 3, 3)
    ep = edge(export(FilledSliceOfADynamicInput(), (x,), dynamic_shapes=({0: B},)))
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))


class FillsOfADynamicInput(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        fill = {
            "full_like": lambda: torch.full_like(x, 2.0),
            "zeros_like": lambda: torch.zeros_like(x[:, 0]).unsqueeze(1) + 1.0,
            "new_ones": lambda: x.new_ones(x.shape),
            "ones_like_slice": lambda: torch.ones_like(x[:, :, :1]),
        }[self.how]()
        return x * 3.0 + fill * 0.5


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("how", ["full_like", "zeros_like", "new_ones", "ones_like_slice"])
def test_a_fill_shaped_like_a_dynamic_input_is_never_evaluated_and_the_report_says_why(how, dialect):
    ep = export(FillsOfADynamicInput(how), (torch.randn(2, 3, 3),), dynamic_shapes=({0: B},))
    if dialect == "edge":
        ep = edge(ep)
    assert list(ep.range_constraints.values())[0].upper == 8  # still dynamic
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    symbolic = [d for d in result.report.decisions if d.reason.name == "SYMBOLIC" and "free symbols" in d.detail]
    assert symbolic, [(d.node, d.reason.name, d.detail) for d in result.report.decisions]
    assert all(d.node in {n.name for n in result.program.graph.nodes} for d in symbolic)
    for batch in (2, 5, 8):
        x = torch.randn(batch, 3, 3)
        assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))


@pytest.mark.parametrize("how", ["full_like", "new_ones"])
def test_a_dynamic_program_lowers_with_the_fold_pass_and_runs_at_each_batch(how):
    """`FoldConstantsPass` inside `to_edge_transform_and_lower`, portable and XNNPACK; the .pte
    runs at several batch sizes (memory planned for the upper bound)."""
    ep = export(FillsOfADynamicInput(how), (torch.randn(2, 3, 3),), dynamic_shapes=({0: B},))
    ref = copy.deepcopy(ep)
    for backend in ("portable", "xnnpack"):
        buffer = stock_lower_pte(copy.deepcopy(ep), backend, [FoldConstantsPass()])
        for batch in (2, 5, 8):
            x = torch.randn(batch, 3, 3)
            assert_close_all(outputs(ref, (x,)), run_pte(buffer, (x,)), atol=1e-4)


def test_a_filled_slice_of_a_dynamic_input_lowers_with_the_fold_pass():
    """The same through `FoldConstantsPass` (Edge, after the decomposition that specialises)."""
    x = torch.randn(2, 3, 3)
    ep = export(FilledSliceOfADynamicInput(), (x,), dynamic_shapes=({0: B},))
    ref = copy.deepcopy(ep)
    buffer = stock_lower_pte(copy.deepcopy(ep), "portable", [FoldConstantsPass()])
    assert_close_all(outputs(ref, (x,)), run_pte(buffer, (x,)), atol=1e-4)
