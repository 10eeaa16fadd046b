"""Programs more than one test module folds (each documents what it exercises)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan


class RewrittenAndHoisted(nn.Module):
    """A tied embedding read through its transpose (`folding.transposed_gathers` rewrites the gather), and
    a ``cond`` whose branches compute the same bytes from the same weight in two ways (moved
    out, lifted as one constant, then passed once: `operands.merge_duplicate_operands`)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2048, 256)  # 2 MiB: a second copy exceeds the growth budget
        self.w = nn.Parameter(torch.randn(256) * 0.1)

    def forward(self, ids, flag):
        def yes(h, w):
            return h * (w * 2).exp()

        def no(h, w):
            return h + (w + w).exp()

        h = torch.cond(flag.sum() > 0, yes, no, (self.emb(ids), self.w))
        return h @ self.emb.weight.t()


class OneCond(nn.Module):
    """Three lines, one ``cond``: constant code in both branches; the predicate reads the input
    (``runtime=True``) or only the weight (then the fold makes it a constant and inlines it)."""

    def __init__(self, runtime: bool):
        super().__init__()
        self.runtime = runtime
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        pred = (x.sum() if self.runtime else self.w.sum()) > 0
        return torch.cond(pred, lambda x: x @ (self.w * 2).t(), lambda x: x - self.w.exp(), (x,))


# An op whose schema declares no write but whose kernel writes its first argument: the kind of
# fault no table can list in advance, caught at fold time by the copy-on-write check.
_lib = torch.library.Library("fold_test", "DEF")
_lib.define("sneaky_bump(Tensor state, Tensor x) -> Tensor")


def _sneaky_bump(state, x):
    state.add_(1.0)  # undeclared: the schema says `Tensor state`, not `Tensor(a!) state`
    return x + state


_lib.impl("sneaky_bump", _sneaky_bump, "CompositeExplicitAutograd")
_lib.impl("sneaky_bump", lambda state, x: torch.empty_like(x), "Meta")


class SneakyWriter(nn.Module):
    """Calls `fold_test.sneaky_bump` on two buffers: the write to ``state`` is undeclared."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))
        self.register_buffer("c", torch.arange(3.0))

    def forward(self, x):
        y = torch.ops.fold_test.sneaky_bump(self.state, self.c)  # constant inputs only
        return x + y, self.state * 10.0


# Control-flow programs that fold into operand merging, moved-out bodies or removed control flow,
# each also folded in Edge dialect (tests/test_control_flow.py).

def _same_after_folding(w: torch.Tensor, how: str) -> torch.Tensor:
    return {"mul1": lambda: w * 1.0, "add0": lambda: w + 0.0, "clone": lambda: w.clone()}[how]()


class CondRepeated(nn.Module):
    """A ``cond`` given a weight and a value with its bytes (``w * 1.0``, ``w + 0.0``,
    ``w.clone()``): both lifted as one stored tensor, so one operand twice
    (`operands.merge_duplicate_operands`)."""

    def __init__(self, how: str):
        super().__init__()
        self.w, self.how = nn.Parameter(torch.randn(4)), how

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x, a, b: (x + a) * b, lambda x, a, b: (x - a) * b,
                          (x, self.w, _same_after_folding(self.w, self.how)))


class MapRepeated(nn.Module):
    """A ``map`` given a weight and its identical copy as operands."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        return hop_map(lambda xi, a, b: (xi + a) * b, xs, self.w, self.w + 0.0)


class ScanRepeated(nn.Module):
    """A ``scan`` given a weight and its identical copy as additional inputs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        a, b = self.w, self.w * 1.0

        def combine(carry, xi):  # a and b become the scan's additional inputs
            y = carry * a + xi * b
            return y, y.clone()

        return scan(combine, torch.zeros(4), xs)


class NestedUnderConstantPredicate(nn.Module):
    """A runtime cond inside the branch a constant predicate takes: inlining brings the inner
    cond (and the caller's inner bodies) to the top level, with repeated operands."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        def inner(x, a, b):
            return torch.cond(x.sum() > 0, lambda x, a, b: (x + a) * b, lambda x, a, b: (x - a) * b, (x, a, b))

        return torch.cond(self.flag, inner, lambda x, a, b: (x * 0 + a,), (x, self.w, self.w * 1.0))


class CondWithoutOperands(nn.Module):
    """Branches whose constant code reads no operand (`bodies` moves it out all the same)."""

    def forward(self, x):
        c = torch.cond(x.sum() > 0, lambda a: (torch.full((4,), -0.5) * 1.0,), lambda a: (torch.ones(4) * 2.0,), (x,))
        return c[0] + x


class ConstantCond(nn.Module):
    """A ``cond`` on constants only, predicate included: folded away entirely."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(False))

    def forward(self, x):
        c = torch.cond(self.flag, lambda w: (w.exp(),), lambda w: (w.cos() * 2,), (self.w,))[0]
        return x + c


class ConstantScan(nn.Module):
    """A ``scan`` over a weight's rows: folded away entirely."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        def combine(carry, wi):
            y = carry + wi.sin()
            return y, y.clone()

        carry, ys = scan(combine, torch.zeros(4), self.w)
        return x + carry + ys.sum(0)
