"""A value that cannot be stored (the tuple of a multi-output op or of a control-flow call) stays
at runtime with each kept ``getitem`` that reads it, and the rest folds
(`folding/core/plan.py`, `_keep_unstorable_inputs`).

A ``getitem`` stays when a kept op observes its strides (a non-persistent buffer split by
``chunk``/``split``/``unbind``/``tensor_split`` for ``scaled_dot_product_attention``,
``dropout`` or ``randn_like``, timm's rotary embedding) or when an in-place op of runtime values
writes what a call on constants returns (a ``no_grad``/autocast region, a ``map``, a ``chunk``);
`lift` has no tensor to store for a tuple, so the call stays with its ``getitem``, with a reason
in the report. Found by issue 21 (fault 5) and the fuzzer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.map import map as hop_map

from folding import FoldPolicy
from tests.control_flow_checks import assert_lowers_folded_as_unfolded, fold_and_compare, fold_checked
from tests.fold_checks import edge, export
from tests.invariants import assert_close_all
from tests.invariants import outputs


# A multi-output op of a constant whose getitem stays at runtime.

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """timm's ``rot`` (timm/layers/pos_embed_sincos.py)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def _sin_cos(emb: torch.Tensor, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    half = emb.shape[-1] // 2
    return {
        "chunk": lambda: emb.chunk(2, -1),
        "split": lambda: emb.split(half, -1),
        "unbind": lambda: emb.unflatten(-1, (2, half)).unbind(-2),
        "tensor_split": lambda: emb.tensor_split(2, -1),
    }[how]()


class RotaryAttention(nn.Module):
    """timm ``eva02``'s attention with ``RotaryEmbeddingCat``: a non-persistent buffer of
    sin/cos, split in two by each of the q and k rotations (two multi-output nodes of one
    buffer), read by an op that observes strides (``scaled_dot_product_attention`` carries
    ``nondeterministic_seeded`` for its dropout; ``dropout(training=True)``, ``randn_like``), and
    used elsewhere too."""

    def __init__(self, how: str, reader: str):
        super().__init__()
        t = torch.arange(5.0)[:, None] * torch.arange(1, 5.0).repeat_interleave(2)[None]
        self.register_buffer("pos_embed", torch.cat([t.sin(), t.cos()], -1), persistent=False)
        self.qkv = nn.Linear(8, 24)
        self.how, self.reader = how, reader

    def _rotate(self, x):
        sin, cos = _sin_cos(self.pos_embed, self.how)
        return x * cos + _rotate_half(x) * sin

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 1, 8)).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self._rotate(q), self._rotate(k)
        if self.reader == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v)
        elif self.reader == "dropout":
            y = q @ k.transpose(-1, -2) + F.dropout(q, 0.5, training=True).sum() * 0
        else:
            y = q @ k.transpose(-1, -2) + torch.randn_like(k).sum() * 0
        return y + self.pos_embed.sum(), self.pos_embed * x.mean()


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("reader", ["sdpa", "dropout", "randn_like"])
@pytest.mark.parametrize("how", ["chunk", "split", "unbind", "tensor_split"])
def test_a_buffer_split_by_two_multi_output_ops_for_a_stride_observer_folds(how, reader, dialect):
    """The multi-output node stays at runtime with its kept ``getitem`` (its tuple cannot be
    stored), with a reason; the rest folds. In Edge the split is ``split_with_sizes_copy``,
    whose pieces are contiguous, so nothing observes a layout and it folds."""
    x = torch.randn(1, 5, 8)
    ep = export(RotaryAttention(how, reader).eval(), (x,))
    if dialect == "edge":
        if reader == "randn_like":
            pytest.skip("randn_like is not an Edge op (to_edge rejects it)")
        ep = edge(ep)
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))
    kept_tuples = [d for d in result.report.decisions if not d.folded and "not a tensor" in d.detail]
    assert all(d.reason.name == "DEPENDS_ON_KEPT" for d in kept_tuples), kept_tuples
    observed = {"sdpa": 2, "dropout": 1, "randn_like": 1}[reader]  # the rotations the reader sees
    assert len(kept_tuples) == (observed if dialect == "aten" else 0), kept_tuples


def test_the_rotary_program_lowers_and_runs_after_folding():
    """The kept ``chunk`` and its ``getitem`` lower, portable and XNNPACK, both fold paths."""
    x = torch.randn(1, 5, 8)
    assert_lowers_folded_as_unfolded(RotaryAttention("chunk", "sdpa"), [(x,)])


# A call whose output a runtime op writes in place.

class RegionOutputWrittenAtRuntime(nn.Module):
    """Constant code in a region (or a map, or a multi-output op) whose output an in-place op of
    runtime values then writes: the call's tuple folds, the ``getitem`` the write aliases stays
    at runtime (fuzz case 26000094, shrunk: ``KeyError`` in `lift`, the tuple had no stored
    value)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("b", torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        if self.how == "no_grad":
            with torch.no_grad():
                v = torch.relu(self.b) * 2.0
        elif self.how == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                v = (torch.relu(self.b) * 2.0).float()
        elif self.how == "map":
            v = hop_map(lambda r: r * 2.0, self.b)
        elif self.how == "chunk":
            v = (self.b * 2.0).chunk(2)[0].repeat(2, 1)
        v.add_(x.mean())
        return x + v


@pytest.mark.parametrize("policy", [None, FoldPolicy.unlimited()], ids=["default", "unlimited"])
@pytest.mark.parametrize("how", ["no_grad", "autocast", "map", "chunk"])
def test_a_folded_call_whose_output_a_runtime_op_writes_stays_with_its_getitem(how, policy):
    g = torch.Generator().manual_seed(1)
    fold_and_compare(RegionOutputWrittenAtRuntime(how).eval(), [(torch.randn(4, 3, generator=g) + 1.0,),
                                                                  (torch.randn(4, 3, generator=g) - 1.0,)],
                     policy=policy)
