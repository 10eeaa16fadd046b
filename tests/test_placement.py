"""The placement stage (`folding.placement.place`): where each folded value goes, decided
without touching a graph. A folded value holding the bytes, dtype and shape of a stored tensor
reuses that tensor's placeholder (`folding.dedup.IdenticalTensors`) instead of storing a copy.
Checked through `lift` (`tests/fold_checks.place_and_lift`, as `fold.py` runs them) with values
computed here with torch, and through a whole fold."""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind

from tests.fold_checks import export, fold, place_and_lift
from tests.invariants import assert_same_outputs
from tests.invariants import assert_caller_unchanged, assert_close_all, caller_snapshot


class _SameBytes(torch.nn.Module):
    """``x * w + w * 1``: ``w * 1`` holds the parameter's bytes, which `mul` still reads."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x):
        return x * self.w + self.w * 1


def test_a_value_with_a_stored_tensors_bytes_reuses_its_placeholder():
    w, x = torch.randn(4, 8), torch.randn(4, 8)
    module = _SameBytes(w)
    program = torch.export.export(module, (x,))
    before = caller_snapshot(program)
    muls = [n for n in program.graph.nodes if n.target is torch.ops.aten.mul.Tensor]
    times_one = next(n for n in muls if 1 in n.args)
    (p_w,) = [n for n in program.graph.nodes if n.op == "placeholder" and n.name != "x"]

    new, record = place_and_lift(program, {times_one}, {times_one: w.clone()}, {p_w})

    assert_caller_unchanged(before, program)
    assert not new.constants  # nothing new stored: the add reads the parameter twice
    assert [s.kind for s in new.graph_signature.input_specs] == [InputKind.PARAMETER, InputKind.USER_INPUT]
    (row,) = record.lifted
    assert row.reused and record.lifted_as == {times_one.name: p_w.name}
    add = next(n for n in new.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert [a.name for a in add.all_input_nodes][1] == p_w.name
    want = module(x)
    assert_close_all(want, new.module()(x), 1e-6, 1e-6, relative=True)


class CopiesAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w + x @ (self.w * 1.0)  # w * 1.0 has w's exact bytes


def test_folded_tensor_equal_to_a_stored_parameter_reuses_it():
    ep = export(CopiesAParameter(), (torch.randn(2, 4),))
    result = fold(ep)
    (lifted,) = result.report.lifted
    assert lifted.reused and lifted.placeholder == "p_w" and lifted.replaces == ("mul",)
    assert not result.program.constants
    assert result.report.constant_bytes_after == result.report.constant_bytes_before == 64
    assert_same_outputs(ep, result.program, (torch.randn(2, 4),))
