"""Programs more than one test module folds (each documents what it exercises)."""

from __future__ import annotations

import torch
import torch.nn as nn


class RewrittenAndHoisted(nn.Module):
    """A tied embedding read through its transpose (`folding.readers` rewrites the gather), and
    a ``cond`` whose branches compute the same bytes from the same weight in two ways (moved
    out, lifted as one constant, then passed once: `bodies.merge_duplicate_operands`)."""

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
