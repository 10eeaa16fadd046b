"""Control flow the fold removes leaves nothing behind: no ``get_attr``, no attached body or
region, no stored tensor that no placeholder names.

A ``cond`` inlined, a ``while_loop``/``map``/``scan`` or a ``no_grad``/autocast region evaluated
whole, and a region of constant code moved out of an autocast region and folded whole, each go
with everything they held: `folding/core/lift.py` erases the get_attrs only folded nodes read and
attaches to the new GraphModule only what its get_attrs read (`hops.graph_module`), and
`folding/control_flow/inline.py` and `folding/control_flow/bodies.py` delete the attributes of a module they own that no
get_attr reads (`hops.drop_unused_attributes`). `control_flow_checks.fold_and_compare` checks
that no dead leftover appears (`invariants.leftovers`); the tests here check the folded
program's module and stored dicts directly. Found by issue 21 (fault 3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.while_loop import while_loop

from tests.control_flow_checks import fold_and_compare
from tests.programs import ConstantCond, ConstantScan

X = torch.randn(4)
BOTH = [(X.abs() + 0.1,), (-X.abs() - 0.1,)]  # x.sum() > 0, then not


class ConstantWhile(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        i, acc = while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc * 0.5 + self.w),
                            (torch.zeros((), dtype=torch.int64), self.w))
        return x + acc


class ConstantMap(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return x + hop_map(lambda wi: wi.exp() * 2, self.w).sum(0)


class ConstantNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        with torch.no_grad():
            c = self.w.exp() * 2
        return x + c


class ConstantAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = self.w @ self.w
        return x + c.float().sum(0)


@pytest.mark.parametrize(
    "make, pte",
    [(ConstantCond, True), (ConstantWhile, True), (ConstantMap, True), (ConstantScan, True),
     (ConstantNoGrad, True), (ConstantAutocast, True)],
    ids=["cond", "while_loop", "map", "scan", "no_grad", "autocast"],
)
def test_control_flow_folded_away_leaves_no_get_attr_submodule_or_tensor(make, pte):
    ep, result = fold_and_compare(make(), BOTH[:1], pte=pte)
    assert not [n for n in result.program.graph.nodes if n.op == "get_attr"]
    assert not list(result.program.graph_module.named_children())
    assert set(result.program.state_dict) | set(result.program.constants) == {
        s.target for s in result.program.graph_signature.input_specs if s.target is not None}


class AutocastMixed(nn.Module):
    """Constant code moved out of an autocast region into a region of its own, which then folds
    whole: that region (``submod_folded``) must not stay attached."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = x @ (self.w @ self.w.t())
        return b.float()


def test_code_moved_out_of_an_autocast_region_leaves_no_region_behind():
    ep, result = fold_and_compare(AutocastMixed(), [(torch.randn(2, 4),)], pte=False)
    children = [name for name, _ in result.program.graph_module.named_children()]
    assert len(children) == 1, children  # the region that reads x
