"""`folding.lift.lift` on its own (after `placement.place`): given the folded nodes and their values, the rebuilt program
(placeholders, signature, stored dicts, names). `lift` edits the graph of the program it is
given, here a copy of the exported program's (as the fold gives it); the exported program,
whose signature and stored dicts the copy shares, stays as it was. The values are computed
here with torch, not by the fold's evaluator."""

from __future__ import annotations


import pytest
import torch
from torch.export.graph_signature import InputKind

from folding.lift import lift
from folding.nonfinite import NonfiniteScan
from folding.placement import place


class _Chain(torch.nn.Module):
    """``x + exp(w * 2)``: the chain ``mul -> exp`` reads only the parameter."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return x + (self.w * 2).exp()


class _SameBytes(torch.nn.Module):
    """``x * w + w * 1``: ``w * 1`` holds the parameter's bytes, which `mul` still reads."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return x * self.w + self.w * 1


def _snapshot(program):
    return ([(n.name, n.op, str(n.target), [str(a) for a in n.args]) for n in program.graph.nodes],
            [(s.kind, s.arg.name, s.target) for s in program.graph_signature.input_specs],
            {k: v.clone() for k, v in program.state_dict.items()}, dict(program.constants))


def _owned(program):
    """What prepare gives `lift`: `program` with a copy of its top-level graph (tensors,
    signature and stored dicts shared), and the map from `program`'s nodes to the copy's."""
    from folding.hops import copy_uncompiled
    from folding.torch_internals import program_with

    gm, env = copy_uncompiled(program.graph_module)
    return program_with(program, graph_module=gm), env


def _place_and_lift(owned, folded, values, constant_placeholders):
    """`placement.place` then `lift`, as `fold.py` runs them."""
    nonfinite = NonfiniteScan()
    placement = place(owned, folded, values, constant_placeholders.__contains__, frozenset(), nonfinite)
    return lift(owned, placement, nonfinite)


def _unchanged(program, snapshot) -> None:
    nodes, specs, state, constants = _snapshot(program)
    assert (nodes, specs, constants.keys()) == (snapshot[0], snapshot[1], snapshot[3].keys())
    assert state.keys() == snapshot[2].keys() and all(torch.equal(state[k], snapshot[2][k]) for k in state)


@pytest.mark.parametrize("seed", range(3))
def test_a_folded_chain_becomes_one_lifted_constant_and_its_parameter_goes(seed):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    module = _Chain(w)
    program = torch.export.export(module, (x,))
    before = _snapshot(program)
    by_target = {n.target: n for n in program.graph.nodes if n.op == "call_function"}
    mul, exp = by_target[torch.ops.aten.mul.Tensor], by_target[torch.ops.aten.exp.default]
    (p_w,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name != "x"]
    folded_value = (w * 2).exp()

    owned, env = _owned(program)
    new, record = _place_and_lift(owned, {env[mul], env[exp]}, {env[exp]: folded_value}, {env[p_w]})

    _unchanged(program, before)
    specs = new.graph_signature.input_specs
    assert [s.kind for s in specs] == [InputKind.CONSTANT_TENSOR, InputKind.USER_INPUT]
    assert torch.equal(new.constants[specs[0].target], folded_value)
    assert "w" not in new.state_dict and record.removed == [p_w.name]
    assert record.lifted_as == {exp.name: specs[0].arg.name}
    ops = [n for n in new.graph.nodes if n.op == "call_function"]
    assert [(n.name, n.target) for n in ops] == [("add", torch.ops.aten.add.Tensor)]  # kept node, same name
    want = module(x)
    torch.testing.assert_close(new.module()(x), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_a_value_with_a_stored_tensors_bytes_reuses_its_placeholder():
    w, x = torch.randn(4, 8), torch.randn(4, 8)
    module = _SameBytes(w)
    program = torch.export.export(module, (x,))
    before = _snapshot(program)
    muls = [n for n in program.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    times_one = next(n for n in muls if 1 in n.args)
    (p_w,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name != "x"]

    owned, env = _owned(program)
    new, record = _place_and_lift(owned, {env[times_one]}, {env[times_one]: w.clone()}, {env[p_w]})

    _unchanged(program, before)
    assert not new.constants  # nothing new stored: the add reads the parameter twice
    assert [s.kind for s in new.graph_signature.input_specs] == [InputKind.PARAMETER, InputKind.USER_INPUT]
    (row,) = record.lifted
    assert row.reused and record.lifted_as == {times_one.name: p_w.name}
    add = next(n for n in new.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert [a.name for a in add.all_input_nodes][1] == p_w.name
    want = module(x)
    torch.testing.assert_close(new.module()(x), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


class _NanThroughAView(torch.nn.Module):
    """``log`` of a weight with negative entries, read through a transpose, next to a ``cond``
    (its bodies make the fold work on a copy of its own, which `lift` edits in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 12).reshape(3, 4))

    def forward(self, x, flag):
        y = torch.cond(flag.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))
        return y @ torch.log(self.w).t()


def test_a_value_lifted_in_place_is_scanned_for_nan_through_its_views():
    """The non-finite scan follows a folded value back through its views (`NonfiniteScan`):
    editing in place must not erase those inputs before the scan reads them."""
    from folding import fold_constants

    x, flag = torch.randn(2, 4), torch.tensor([1])
    ep = torch.export.export(_NanThroughAView().eval(), (x, flag))
    result = fold_constants(ep)
    (row,) = [c for c in result.report.lifted if not c.reused]
    assert row.nonfinite, row
    want, got = ep.module()(x, flag), result.program.module()(x, flag)
    assert torch.equal(torch.isnan(want), torch.isnan(got)) and torch.isnan(got).any()
