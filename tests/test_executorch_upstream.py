"""Faults of executorch 1.5.1 that a fold can expose, each pinned by a strict xfail that passes
once executorch fixes it (then the workaround it names can go), next to a test that the
workaround makes folded and unfolded programs right.

1. Issue 21490: a ``cond``'s outputs are overwritten by a later ``cond``, because the emitter
   moves them to the caller by pointer (``MoveCall``) out of the arena every control-flow body
   shares (PRs 21494, 21818 fix it). Folded or not, the .pte returns a wrong value. Worked
   around by `tests.lowering.CopyControlFlowOutputs`.
2. XNNPACK: a value returned as itself and as a clone (or as two clones) fails to lower: the
   clones are removed inside the delegate, which then returns one value twice, and XNNPACK's
   preprocess rejects that. Worked around by `tests.lowering.xnnpack_partitioner`.
3. XNNPACK kernels differ from eager on extreme inputs (``sqrt(inf)`` is NaN, …). Not worked
   around: the fuzzer does not hold XNNPACK to eager on those (`tests.fuzz.extremes`).

Inlining a constant-predicate ``cond`` brings code out of a branch, where it ran on portable
kernels, to the top level, where XNNPACK takes it: 2 and 3 then show on a folded program whose
unfolded program lowered and ran right (fuzz cases 23000294 and 23000074).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import fold_constants
from tests.fuzz.extremes import KERNELS
from tests.lowering import edge_pte, lower_pte, private_copy, run_pte, to_edge_program, xnnpack_partitioner


class ConsecutiveConds(nn.Module):
    """The first cond's result is read after the second cond ran."""

    def forward(self, x):
        a = torch.cond(x.sum() > 0, lambda x: (x * 2.0,), lambda x: (x * 3.0,), (x,))[0]
        b = torch.cond(x.mean() > 0, lambda x: (x + 1.0,), lambda x: (x - 1.0,), (x,))[0]
        return a, b


class NestedConds(nn.Module):
    """The same two conds inside a branch of a third one."""

    def forward(self, x):
        def both(x):
            u = x * 5.0
            a = torch.cond(x.sum() > 0, lambda x: (x * 2.0,), lambda x: (x * 3.0,), (x,))[0]
            b = torch.cond(x.mean() > 0, lambda x: (x + 1.0,), lambda x: (x - 1.0,), (x,))[0]
            return a + u, b

        return torch.cond(x.max() > 0, both, lambda x: (x * 1.0, x + 7.0), (x,))


class ConstantTwiceConds(nn.Module):
    """Fuzz case 11000257, shrunk: branches returning one constant twice, next to a second
    such cond; after folding, each branch returns clones of a lifted constant."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("b", torch.randn(4, generator=g))
        self.w = nn.Parameter(torch.randn(1, 4, generator=g))

    def forward(self, x):
        def twice(c):
            return c.clone(), c.clone()

        v = torch.cond(x.mean() < 0, lambda a: (a * 2.0, *twice(self.b * 0.5)),
                       lambda a: (a.sigmoid(), *twice(self.b + 1.0)), (x,))[2]
        w = self.w * 2.0
        u = torch.cond(x.sum() > 0, lambda a: (a * 0.5, *twice(w * 0.5)),
                       lambda a: (a + 1.0, *twice(w + 1.0)), (x,))[2]
        return u, v


PROGRAMS = [ConsecutiveConds, NestedConds, ConstantTwiceConds]


def _inputs(seed: int) -> tuple[torch.Tensor]:
    # positive inputs: every predicate above takes its true branch, the values are O(1)
    return (torch.rand(4, generator=torch.Generator().manual_seed(seed)) + 0.5,)


def _assert_matches(want, got) -> None:
    assert len(want) == len(got)
    for w, g in zip(want, got):
        scale = w.abs().max().item()
        assert scale > 0.1
        torch.testing.assert_close(g, w, atol=1e-5 * scale, rtol=1e-5)


@pytest.mark.xfail(strict=True, reason="executorch issue 21490: the first cond's output is overwritten by the second")
@pytest.mark.parametrize("model", [ConsecutiveConds, NestedConds], ids=lambda m: m.__name__)
def test_executorch_keeps_a_cond_output_alive_across_the_next_cond(model):
    module = model().eval()
    inputs = _inputs(0)
    buffer = lower_pte(torch.export.export(module, inputs), copy_control_flow_outputs=False)
    _assert_matches(module(*inputs), run_pte(buffer, inputs))


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("model", PROGRAMS, ids=lambda m: m.__name__)
def test_copying_control_flow_outputs_makes_folded_and_unfolded_pte_right(model, dialect):
    module = model().eval()
    for seed in range(3):
        inputs = _inputs(seed)
        want = module(*inputs)
        program = torch.export.export(module, inputs)
        if dialect == "edge":
            program = to_edge_program(program)
        for candidate in (program, fold_constants(program).program):
            buffer = edge_pte(candidate) if dialect == "edge" else lower_pte(candidate)
            _assert_matches(want, run_pte(buffer, inputs))


def test_each_control_flow_output_is_copied_before_the_next_cond_runs():
    """Delegation can leave a ``cond``'s ``getitem`` after the next ``cond`` (fuzz case 26000182,
    XNNPACK): the copy must still come before it, or the next body overwrites the value."""
    import operator

    from tests.lowering import CopyControlFlowOutputs

    program = to_edge_program(torch.export.export(ConsecutiveConds().eval(), _inputs(0)))
    graph = program.graph_module.graph
    first, second = graph.find_nodes(op="call_function", target=torch.ops.higher_order.cond)
    item = next(u for u in first.users if u.target is operator.getitem)
    second.append(item)  # the getitem of the first cond now follows the second cond
    CopyControlFlowOutputs()(program.graph_module)
    order = list(graph.nodes)
    copy = next(u for u in item.users if "clone" in str(u.target))
    assert order.index(first) < order.index(item) < order.index(copy) < order.index(second)


# -- 2. XNNPACK: one value returned twice through clones ------------------------------------------


class ReturnedTwice(nn.Module):
    """``c`` (computed where XNNPACK takes it) returned as itself and as a clone, or as two clones."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("b", torch.randn(2, 4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        c = x * 2.0 + self.b
        first = c if self.how == "itself and a clone" else c.clone()
        return x + 1.0, first, c.clone()


def _xnnpack_pte(program, partitioner) -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    from tests.lowering import backend_config

    return to_edge_transform_and_lower(private_copy(program), partitioner=[partitioner]).to_executorch(
        backend_config()).buffer


HOW = ["itself and a clone", "two clones"]


@pytest.mark.xfail(strict=True, reason="XNNPACK (executorch 1.5.1): 'Output node ... is already in the inputs'")
@pytest.mark.parametrize("how", HOW)
def test_xnnpack_lowers_a_value_returned_twice_through_clones(how):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    module = ReturnedTwice(how).eval()
    inputs = (torch.rand(2, 4, generator=torch.Generator().manual_seed(0)) + 0.5,)
    buffer = _xnnpack_pte(torch.export.export(module, inputs), XnnpackPartitioner())
    _assert_matches(module(*inputs), run_pte(buffer, inputs))


@pytest.mark.parametrize("how", HOW)
def test_keeping_clones_off_xnnpack_lowers_folded_and_unfolded_programs(how):
    module = ReturnedTwice(how).eval()
    inputs = (torch.rand(2, 4, generator=torch.Generator().manual_seed(0)) + 0.5,)
    program = torch.export.export(module, inputs)
    for candidate in (program, fold_constants(program).program):
        _assert_matches(module(*inputs), run_pte(_xnnpack_pte(candidate, xnnpack_partitioner()), inputs))


# -- 3. XNNPACK kernels on extreme inputs --------------------------------------------------------

# For each op of `tests.fuzz.extremes.KERNELS`: the op and an input where XNNPACK differs.
EXTREME = {
    "aten.sqrt.default": (torch.sqrt, float("inf")),
    "aten.rsqrt.default": (torch.rsqrt, 0.0),
    "aten.log.default": (torch.log, 1e-40),
    "aten.ceil.default": (torch.ceil, 1e-40),
    "aten.sigmoid.default": (torch.sigmoid, 1e30),
    "aten.sin.default": (torch.sin, 1e30),
}


class OnExtreme(nn.Module):
    """``y + op(x)`` on XNNPACK; a ``cumsum`` (not an XNNPACK op) keeps a portable chain."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x, y):
        return y + self.op(x), y.cumsum(0)


def _extreme_case(name: str):
    op, value = EXTREME[name]
    x = torch.tensor([[4.0, value, 0.5, 2.0]] * 2)
    y = torch.ones(2, 4)
    module = OnExtreme(op)
    return module, (x, y), torch.export.export(module, (x, y))


def _assert_same(want, got) -> None:
    for w, g in zip(want, got):  # the same values, NaN where NaN, inf where inf
        torch.testing.assert_close(g, w, atol=1e-5 * w.abs().nan_to_num(0, 0, 0).max().item(), rtol=1e-4,
                                   equal_nan=True)


def test_every_kernel_the_fuzzer_excuses_is_pinned_here():
    assert set(EXTREME) == set(KERNELS)


@pytest.mark.xfail(strict=True, reason="XNNPACK (executorch 1.5.1) differs from eager on extreme inputs")
@pytest.mark.parametrize("name", sorted(EXTREME))
def test_xnnpack_matches_eager_on_extreme_inputs(name):
    module, inputs, program = _extreme_case(name)
    _assert_same(module(*inputs), run_pte(lower_pte(program, "xnnpack"), inputs))


@pytest.mark.parametrize("name", sorted(EXTREME))
def test_portable_kernels_match_eager_on_the_same_inputs(name):
    module, inputs, program = _extreme_case(name)
    _assert_same(module(*inputs), run_pte(lower_pte(program, "portable"), inputs))
