"""Each executorch internal `folding.core.executorch_internals` names still does what the fold relies
on (executorch 1.5.1): these fail when an executorch upgrade changes one, with a message naming
it. Real executorch programs throughout (no stand-ins)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from executorch.exir import EdgeCompileConfig, to_edge

from folding.core import executorch_internals as ei
from folding.core.dialect import dialect_op


class _Small(nn.Module):
    """A linear layer (Edge: ``permute_copy`` of its weight, ``addmm``), a ``full`` and a ``clone``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x).clone() + torch.full((3,), 2.0)


def _edge(dim_order: bool = True):
    ep = torch.export.export(_Small().eval(), (torch.randn(2, 4),))
    return to_edge(ep, compile_config=EdgeCompileConfig(_skip_dim_order=not dim_order)).exported_program()


def _calls(program) -> list:
    return [n for n in program.graph.nodes if n.op == "call_function"]


class _Copies(nn.Module):
    """Every ATen op `dialect.dialect_op` maps to another Edge op: views, ``clone``, ``_to_copy``."""

    def forward(self, x):
        return x.view(4, 3).permute(1, 0).expand(2, 3, 4).clone().to(torch.float16)


@pytest.mark.parametrize("dim_order", [True, False], ids=["dim_order", "skip_dim_order"])
def test_edge_ops_are_the_ops_to_edge_puts_in_a_program(dim_order):
    """`dialect.dialect_op` (what `lift`, `weight_fusion` and the workarounds insert or look
    for) and `transposed_gathers` name ``edge_ops().edge...`` ops: in each dialect they must be
    the very objects torch.export and ``to_edge`` put in place of the ATen op, so every rule
    that compares targets (and the Edge verifier, with or without dim order) sees the same op."""
    aten = torch.export.export(_Copies(), (torch.randn(3, 4),)).run_decompositions()
    edge = to_edge(aten, compile_config=EdgeCompileConfig(_skip_dim_order=not dim_order)).exported_program()
    names = ("aten.view.default", "aten.permute.default", "aten.expand.default", "aten.clone.default",
             "aten._to_copy.default")
    for program in (aten, edge):
        targets = {n.target for n in _calls(program)}
        assert [n for n in names if dialect_op(program, n) not in targets] == [], (program.dialect, targets)
        assert dialect_op(program, "aten.no_such_op.default") is None
    x = torch.randn(3, 5)
    ops = ei.edge_ops()
    assert torch.equal(ops.edge.aten.index_select.default(x, 0, torch.tensor([2, 0])), x[[2, 0]])
    assert torch.equal(ops.edge.aten.view_copy.default(x, [5, 3]), x.reshape(5, 3))


def test_an_edge_overload_wraps_the_aten_overload_it_runs():
    """`ops.aten_overload` looks through an Edge op to its ATen overload (``EdgeOpOverload._op``):
    every op table of `folding.core.ops` is keyed by ATen overload and reads its schema and tags."""
    calls = _calls(_edge())
    assert calls
    for n in calls:
        aten = ei.edge_overload_aten(n.target)
        assert isinstance(aten, torch._ops.OpOverload), f"{n.target} ({type(n.target)}) wraps no ATen overload"
        assert n.target.__name__ == str(aten), (n.target.__name__, str(aten))
        assert str(n.target._schema) == str(aten._schema).replace(aten._schema.name, n.target._schema.name)
    assert ei.edge_overload_aten(torch.ops.aten.add.Tensor) is None  # torch's `_op` is a C++ callable
    assert ei.edge_overload_aten(torch.ops.higher_order.cond) is None
    assert ei.edge_overload_aten(ei.edge_ops().edge.aten.add.Tensor) is torch.ops.aten.add.Tensor


def test_an_edge_packet_is_named_as_torch_names_its_packet():
    """``EdgeOpOverloadPacket._qualified_op_name`` (``"aten::full"``) gives the packet name the
    policy's op names and `ops.op_name` use (``aten.full``, as ``str(torch.ops.aten.full)``)."""
    edge = ei.edge_ops().edge
    for packet, aten in ((edge.aten.full, torch.ops.aten.full), (edge.aten.add, torch.ops.aten.add),
                         (edge.dim_order_ops._clone_dim_order, torch.ops.dim_order_ops._clone_dim_order)):
        assert ei.edge_packet_name(packet) == str(aten), (ei.edge_packet_name(packet), str(aten))
    assert ei.edge_packet_name(torch.ops.aten.add.Tensor) is None
    assert ei.edge_packet_name(lambda x: x) is None
