"""The QNN partition fold's own reading of a program (`qnn/partition_fold.py`): which nodes are
computed from stored tensors only (`constant_only`), without the QNN libraries' help."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from folding.core.signature import input_specs_by_name
from folding.core.sizes import stored_tensor
from qnn.partition_fold import constant_only


class _WritesState(nn.Module):
    """Constant-only code of a parameter nothing writes (``a``), of a buffer the graph writes in
    place (``count``, training IR: an op, not a BUFFER_MUTATION output) and of a parameter
    written in a ``torch.no_grad()`` block (``b``)."""

    def __init__(self, write: str):
        super().__init__()
        self.a = nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(1)))
        self.b = nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(2)))
        self.register_buffer("count", torch.ones(4))
        self.write = write

    def forward(self, x):
        y = x * self.a.exp() + (self.count * 2.0).sin() + self.b.cos()
        if self.write == "buffer_add_":
            self.count.add_(1.0)
        elif self.write == "buffer_view_fill_":
            self.count[1:].fill_(5.0)
        elif self.write == "no_grad_mul_":
            with torch.no_grad():
                self.b.mul_(0.5)
        return y


class _Values(torch.fx.Interpreter):
    """Runs a program's graph, recording each node's value (cloned) by name."""

    def __init__(self, gm, seen: dict):
        super().__init__(gm)
        self.seen = seen

    def run_node(self, n):
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.seen[n.name] = value.detach().clone()
        return value


@pytest.mark.parametrize("write", ["buffer_add_", "buffer_view_fill_", "no_grad_mul_"])
def test_constant_only_nodes_have_the_same_value_at_every_call(write):
    """Each node `constant_only` names has the same value in 3 calls of the graph on the same
    stored tensors (each call reads what the last one wrote); the unwritten parameter's code is
    among them."""
    x = torch.randn(4, generator=torch.Generator().manual_seed(3))
    ep = torch.export.export(_WritesState(write), (x,))
    constant = {n.name for n in constant_only(ep)}
    assert "exp" in constant
    specs = input_specs_by_name(ep.graph_signature)
    stored = {name: copy.deepcopy(stored_tensor(s, ep.state_dict, ep.constants)) for name, s in specs.items()
              if name != "x"}
    args = [stored[n.name] if n.name in stored else x for n in ep.graph.find_nodes(op="placeholder")]
    calls = []
    with torch.no_grad():
        for _ in range(3):
            calls.append({})
            _Values(ep.graph_module, calls[-1]).run(*args)
    changed = sorted(name for name in calls[0] if any(not torch.equal(calls[0][name], c[name]) for c in calls[1:]))
    assert changed, "the program writes nothing the calls read: the check proves nothing"
    assert not constant.intersection(changed), f"constant_only names nodes whose values change: {constant & set(changed)}"
