"""`folding.core.lift.lift` on its own (after `placement.place`): given the folded nodes and their values, the rebuilt program
(placeholders, signature, stored dicts, names). `lift` builds a new graph from the surviving
nodes of the program it is given, here the exported program itself (as the fold gives it when
no rewrite applies), which stays as it was. The values are computed
here with torch, not by the fold's evaluator. Placement's own rules (a stored tensor reused):
test_placement.py."""

from __future__ import annotations


import pytest
import torch
from torch.export.graph_signature import InputKind

from tests.fold_checks import place_and_lift
from tests.invariants import assert_caller_unchanged, assert_close_all, caller_snapshot


class _Chain(torch.nn.Module):
    """``x + exp(w * 2)``: the chain ``mul -> exp`` reads only the parameter."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return x + (self.w * 2).exp()


@pytest.mark.parametrize("seed", range(3))
def test_a_folded_chain_becomes_one_lifted_constant_and_its_parameter_goes(seed):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    module = _Chain(w)
    program = torch.export.export(module, (x,))
    before = caller_snapshot(program)
    by_target = {n.target: n for n in program.graph.nodes if n.op == "call_function"}
    mul, exp = by_target[torch.ops.aten.mul.Tensor], by_target[torch.ops.aten.exp.default]
    (p_w,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name != "x"]
    folded_value = (w * 2).exp()

    new, record = place_and_lift(program, {mul, exp}, {exp: folded_value}, {p_w})

    assert_caller_unchanged(before, program)
    specs = new.graph_signature.input_specs
    assert [s.kind for s in specs] == [InputKind.CONSTANT_TENSOR, InputKind.USER_INPUT]
    assert torch.equal(new.constants[specs[0].target], folded_value)
    assert "w" not in new.state_dict and record.removed == [p_w.name]
    assert record.lifted_as == {exp.name: specs[0].arg.name}
    ops = [n for n in new.graph.nodes if n.op == "call_function"]
    assert [(n.name, n.target) for n in ops] == [("add", torch.ops.aten.add.Tensor)]  # kept node, same name
    want = module(x)
    assert_close_all(want, new.module()(x), 1e-6, 1e-6, relative=True)


class _NanThroughAView(torch.nn.Module):
    """``log`` of a weight with negative entries, read through a transpose, next to a ``cond``
    (the rewrites leave the top-level graph alone: `lift` reads the caller's graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 12).reshape(3, 4))

    def forward(self, x, flag):
        y = torch.cond(flag.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        return y @ torch.log(self.w).t()


def test_a_value_lifted_in_place_is_scanned_for_nan_through_its_views():
    """The non-finite scan follows a folded value back through its views (`NonfiniteScan`)."""
    from folding import fold_constants

    x, flag = torch.randn(2, 4), torch.tensor([1])
    ep = torch.export.export(_NanThroughAView().eval(), (x, flag))
    result = fold_constants(ep)
    (row,) = [c for c in result.report.lifted if not c.reused]
    assert row.nonfinite, row
    want, got = ep.module()(x, flag), result.program.module()(x, flag)
    assert torch.equal(torch.isnan(want), torch.isnan(got)) and torch.isnan(got).any()


class _Float8Nan(torch.nn.Module):
    """A folded float8_e4m3fn value holding a NaN (``0 / 0``), returned as it is: torch has no
    ``isfinite`` for it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.0, 1.0, 2.0, 3.0]))

    def forward(self, x):
        return x + 1.0, (self.w / self.w[0]).to(torch.float8_e4m3fn)


def test_a_float8_value_holding_nan_is_reported_nonfinite():
    """issue 52: the non-finite scan read float8 values as finite (``isfinite`` raised)."""
    from folding import fold_constants

    x = torch.randn(4)
    ep = torch.export.export(_Float8Nan(), (x,))
    result = fold_constants(ep)
    rows = [c for c in result.report.lifted if not c.reused]
    assert rows and all(row.nonfinite for row in rows), rows
    want, got = ep.module()(x)[1].float(), result.program.module()(x)[1].float()
    assert torch.equal(torch.isnan(want), torch.isnan(got)) and torch.isnan(got).any()
