"""executorch issue 21490 (open in executorch 1.5.1): a ``cond``'s outputs are overwritten by a
later ``cond``, because the emitter moves them to the caller by pointer (``MoveCall``) out of
the arena every control-flow body shares. Folded or not, the .pte returns a wrong value.

The strict xfails pass once executorch plans those outputs apart (PRs 21494, 21818); then
`tests.lowering.CopyControlFlowOutputs`, the workaround every .pte check here uses, can go.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import fold_constants
from tests.lowering import edge_pte, lower_pte, run_pte, to_edge_program


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
