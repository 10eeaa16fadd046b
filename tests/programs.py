"""Programs more than one test module folds (each documents what it exercises)."""

from __future__ import annotations

import torch
import torch.nn as nn


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
