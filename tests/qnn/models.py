"""The acceptance models of issue 5: constant-only ops QNN keeps whole, stranded on HTP.

Each model pairs a constant-only branch with runtime work that uses the same ops *after* it,
so that folding the constant branch would shift ``to_edge``'s names of the runtime nodes
(``aten_linear_default_1`` -> ``aten_linear_default``) unless they are preserved.

`CASES` maps a case name to a `Case`: the module, example inputs and the ``skip_node_op_set``
that cuts the constant branch off from every runtime input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

RELU = "aten.relu.default"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class LinearCutOffByRelu(torch.nn.Module):
    """``relu(linear(table, weight))``: the linear reads only parameters and the skipped relu
    cuts it off, so its partition has no runtime input."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        g = _gen(1)
        self.table = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.weight = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(F.linear(self.table, self.weight))
        return self.proj(x) + k


class RmsNormOfParameter(torch.nn.Module):
    """``rms_norm`` of a parameter, cut off by a skipped relu; a runtime rms_norm follows."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        g = _gen(2)
        self.p = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.gamma = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)
        self.gamma2 = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(F.rms_norm(self.p, [self.p.shape[-1]], self.gamma))
        return F.rms_norm(x, [x.shape[-1]], self.gamma2) * k


class ScatterOnConstants(torch.nn.Module):
    """``scatter``, ``scatter_add`` and ``scatter_reduce`` of buffers, cut off by skipped relus;
    a runtime ``scatter`` follows (HTP validates ``scatter_add``/``scatter_reduce`` on runtime
    inputs not at all: test_acceptance.py::test_runtime_scatter_add_runs_on_the_cpu)."""

    def __init__(self) -> None:
        super().__init__()
        g = _gen(3)
        self.register_buffer("base", torch.randn(4, 8, generator=g))
        self.register_buffer("index", torch.randint(0, 4, (2, 8), generator=g))
        self.register_buffer("src", torch.randn(2, 8, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.base.scatter(0, self.index, self.src))
        b = torch.relu(self.base.scatter_add(0, self.index, self.src))
        c = torch.relu(self.base.scatter_reduce(0, self.index, self.src, "prod", include_self=True))
        y = x.scatter(0, self.index, self.src) + x
        return y + a + b + c


class PixelUnshuffleOfConstant(torch.nn.Module):
    """``pixel_unshuffle`` of a buffer, cut off by a skipped relu; a runtime one follows."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("image", torch.randn(1, 2, 8, 8, generator=_gen(4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(F.pixel_unshuffle(self.image, 2))
        return F.pixel_unshuffle(x, 2) + k


class LinearFeedsAddAndMaskedSelect(torch.nn.Module):
    """A constant linear whose result feeds both ``x + k`` and ``k[mask].sum()`` (a
    data-dependent shape). The mask is a constant; the sum is a graph output."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        g = _gen(5)
        self.table = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.weight = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.register_buffer("mask", torch.rand(4, d, generator=g) > 0.5)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor):
        k = F.linear(self.table, self.weight)
        return self.proj(x) + k, k[self.mask].sum()


class SeveralConstantBranches(torch.nn.Module):
    """The kinds above together: a cut-off constant linear, rms_norm, scatter and
    pixel_unshuffle, each followed by runtime uses of the same ops."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        g = _gen(6)
        self.table = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.weight = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.gamma = torch.nn.Parameter(torch.rand(d, generator=g) + 0.5)
        self.register_buffer("index", torch.randint(0, 4, (2, d), generator=g))
        self.register_buffer("src", torch.randn(2, d, generator=g))
        self.register_buffer("image", torch.randn(1, 1, 8, 8, generator=g))
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k1 = torch.relu(F.linear(self.table, self.weight))
        k2 = torch.relu(F.rms_norm(self.table, [self.table.shape[-1]], self.gamma))
        k3 = torch.relu(self.table.scatter_add(0, self.index, self.src))
        k4 = torch.relu(F.pixel_unshuffle(self.image, 2)).reshape(4, -1)
        y = self.proj(x) + k1
        y = F.rms_norm(y, [y.shape[-1]], self.gamma) * k2
        y = y.scatter_add(0, self.index, self.src) + k3
        return y + k4


@dataclass
class Case:
    """One acceptance model: ``make()`` builds it, ``inputs`` are example inputs,
    ``skip_ops`` is the ``skip_node_op_set`` for QnnPartitioner."""

    make: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple]
    skip_ops: frozenset = field(default_factory=lambda: frozenset({RELU}))


def _x(*shape: int, seed: int = 0) -> Callable[[], tuple]:
    return lambda: (torch.randn(*shape, generator=_gen(100 + seed)),)


CASES: dict[str, Case] = {
    "linear_cut_off_by_relu": Case(LinearCutOffByRelu, _x(4, 64)),
    "rms_norm_of_parameter": Case(RmsNormOfParameter, _x(4, 32)),
    "scatter_on_constants": Case(ScatterOnConstants, _x(4, 8)),
    "pixel_unshuffle_of_constant": Case(PixelUnshuffleOfConstant, _x(1, 2, 8, 8)),
    "linear_feeds_add_and_masked_select": Case(LinearFeedsAddAndMaskedSelect, _x(4, 16), frozenset()),
    "several_constant_branches": Case(SeveralConstantBranches, _x(4, 16)),
}


class SkipIdShift(torch.nn.Module):
    """A constant ``mul`` before a runtime one: folding it would rename the runtime
    ``aten_mul_tensor_1`` to ``aten_mul_tensor`` without name restoration. The runtime ``mul``
    reads a ``sigmoid``, not the ``linear``: the fold would otherwise move its scale into the
    linear's weight (`folding.rewrites.weight_fusion`), and no runtime ``mul`` would be left to name."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        g = _gen(8)
        self.table = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.weight = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.relu(F.linear(self.table, self.weight) * 2.0)
        return torch.sigmoid(self.proj(x)) * 3.0 + k


class RenamedOutput(torch.nn.Module):
    """A graph output whose Edge name shifts when the constant ``mul`` before it is folded."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        g = _gen(9)
        self.table = torch.nn.Parameter(torch.randn(4, d, generator=g))
        self.weight = torch.nn.Parameter(torch.randn(d, d, generator=g) / d**0.5)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor):
        k = torch.relu(F.linear(self.table, self.weight) * 2.0)
        y = self.proj(x)
        return y * 3.0 + k, y * 5.0
