"""Issue 54 on the real backend: batch norms folded into the weights they follow (or into a
per-channel mul and add) make fp16 HTP compute the model, where executorch 1.5.1's QNN
BatchNorm builder, which ignores the node's eps, does not.

Each block is lowered fold off and fold on (`qnn.to_edge_transform_and_lower_to_qnn`, fp16,
SM8650) and its ``.pte`` run on the emulated HTP (QNN 2.49.40). The blocks have realistic
statistics: quiet channels whose running variances lie in [1e-4, 1e-2] (below and near eps
1e-3, as trained checkpoints' dead and quiet channels are), means measured on the data, negative
gammas. Fold on must be within the fp16 bound of eager (`benchmarks.verdict`, the model's own
fp16 arithmetic); fold off must be far outside it and, to within the same bound, be the model
computed with every batch norm's eps set to 1e-9 (`benchmarks.htp_faults`' fault).
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import qnn
from benchmarks import fp16_emulation, verdict

from .helpers import compiler_specs, lower_with_wrapper

EPS = 1e-3
FAR = 10.0
"""Fold off must miss eager by more than this many times the fp16 bound."""


def _norms(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _quiet_statistics(model: nn.Module, inputs: Tuple[torch.Tensor, ...], g: torch.Generator,
                      producers: Dict[nn.Module, nn.Module]) -> None:
    """Give every batch norm of `model` running statistics of quiet channels: the weight op
    before it (`producers`) rescaled per output channel so that its output's variance on
    `inputs` is a target drawn log-uniformly from [1e-4, 1e-2]; running mean and variance
    measured on `inputs` (times 0.8-1.2); gammas of magnitude 0.5-1.5, about half negative;
    betas N(0, 0.1). A batch norm without a producer reads data already quiet (the caller's
    inputs)."""
    seen: Dict[nn.Module, torch.Tensor] = {}

    def measure():
        hooks = [bn.register_forward_pre_hook(lambda m, a: seen.__setitem__(m, a[0].detach()))
                 for bn in _norms(model)]
        with torch.no_grad():
            model(*inputs)
        for h in hooks:
            h.remove()

    def channels_last(x: torch.Tensor) -> torch.Tensor:
        return x.movedim(1, -1).reshape(-1, x.shape[1])

    measure()
    with torch.no_grad():
        for bn, op in producers.items():
            target = 10 ** torch.empty(bn.num_features).uniform_(-4, -2, generator=g)
            factor = (target / channels_last(seen[bn]).var(0)).sqrt()
            op.weight.mul_(factor.view(-1, *([1] * (op.weight.dim() - 1))))
            if op.bias is not None:
                op.bias.mul_(factor)
    measure()
    with torch.no_grad():
        for bn in _norms(model):
            x = channels_last(seen[bn])
            n = bn.num_features
            bn.eps = EPS
            bn.running_mean.copy_(x.mean(0))
            bn.running_var.copy_(x.var(0) * torch.empty(n).uniform_(0.8, 1.2, generator=g))
            sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
            bn.weight.copy_(sign * torch.empty(n).uniform_(0.5, 1.5, generator=g))
            bn.bias.copy_(0.1 * torch.randn(n, generator=g))


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearBn1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.bn = nn.Linear(32, 24), nn.BatchNorm1d(24)

    def forward(self, x):
        return self.bn(self.linear(x))


class BnOnInput(nn.Module):
    """A batch norm with nothing before it to fuse into, then a conv."""

    def __init__(self):
        super().__init__()
        self.bn, self.conv = nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(self.bn(x)))


class ConvTwoReaders(nn.Module):
    """The conv's output is read by the batch norm and by the add: no fuse into the conv."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + 4.0 * y


class DepthwiseBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        return nn.functional.hardtanh(self.bn(self.conv(x)), 0.0, 6.0)


def _image(g: torch.Generator, quiet: bool = False) -> torch.Tensor:
    x = torch.randn(2, 8, 12, 12, generator=g)
    if quiet:  # channels with variances 1e-4..1e-2 around means of -1..1
        std = 10 ** torch.empty(8).uniform_(-2, -1, generator=g)
        x = x * std.view(1, -1, 1, 1) + torch.empty(8).uniform_(-1, 1, generator=g).view(1, -1, 1, 1)
    return x


def _build(name: str) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    """Block `name` with quiet statistics (seeded) and its example input."""
    g = torch.Generator().manual_seed(54)
    torch.manual_seed(54)
    model = BLOCKS[name][0]()
    inputs = (BLOCKS[name][1](g),)
    producers = {} if name == "bn_on_input" else {model.bn: getattr(model, "conv", None) or model.linear}
    _quiet_statistics(model, inputs, g, producers)
    return model.eval(), inputs


BLOCKS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[torch.Generator], torch.Tensor]]] = {
    "conv_bn_relu": (ConvBnRelu, _image),
    "linear_bn1d": (LinearBn1d, lambda g: torch.randn(8, 32, generator=g)),
    "bn_on_input": (BnOnInput, lambda g: _image(g, quiet=True)),
    "conv_two_readers": (ConvTwoReaders, _image),
    "depthwise_bn": (DepthwiseBn, _image),
}


def _eps_ignored(model: nn.Module) -> nn.Module:
    """`model` as executorch 1.5.1's QNN BatchNorm builder computes it: every eps 1e-9."""
    faulty = copy.deepcopy(model)
    for bn in _norms(faulty):
        bn.eps = 1e-9
    return faulty


def _on_htp(model: nn.Module, inputs, fold: bool) -> torch.Tensor:
    manager = lower_with_wrapper(model, inputs, compiler_specs(fold))
    (out,) = qnn.run_pte(manager.to_executorch().buffer, inputs)
    return out


def _tolerance(model: nn.Module, inputs, want: torch.Tensor, diff: float) -> verdict.Tolerance:
    """The fp16 bound of `model` at `want`'s scale, for a difference `diff`."""
    return verdict.tolerance_of("fp16", float(want.abs().max()), diff,
                                fp16_error=lambda: fp16_emulation.fp16_error(model, inputs, [want]))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_batch_norm_block_on_htp_fold_on_computes_eager_and_fold_off_ignores_eps(name):
    model, inputs = _build(name)
    with torch.no_grad():
        want = model(*inputs)
        as_builder = _eps_ignored(model)(*inputs)
    scale = float(want.abs().max())
    # the statistics make eps matter: ignoring it moves the output far beyond fp16's rounding
    assert float((as_builder - want).abs().max()) > 0.1 * scale

    on = _on_htp(model, inputs, fold=True)
    diff_on = float((on - want).abs().max())
    bound = _tolerance(model, inputs, want, diff_on)
    assert diff_on <= bound.limit, f"fold on: {diff_on:.3g} > {bound.rule}"

    off = _on_htp(model, inputs, fold=False)
    diff_off = float((off - want).abs().max())
    assert diff_off > FAR * bound.limit, f"fold off: {diff_off:.3g}, bound {bound.rule}"
    # attribution: fold off is the model with eps 1e-9, to within that model's fp16 bound
    diff_fault = float((off - as_builder).abs().max())
    fault_bound = _tolerance(_eps_ignored(model), inputs, as_builder, diff_fault)
    assert diff_fault <= fault_bound.limit, f"fold off vs eps 1e-9: {diff_fault:.3g} > {fault_bound.rule}"


def test_benchmark_rows_of_a_batch_norm_block_fold_off_attributed_fold_on_ok():
    """The benchmark's QNN rows (`benchmarks.qnn_rows`, the module exported non-strict as
    `benchmarks.qnn_unit` does): fold off a mismatch attributed to the builder; fold on ``ok``
    under the fp16 bound, though far from fold off's wrong output, and no larger a ``.pte``."""
    from benchmarks import qnn_rows

    model, inputs = _build("conv_bn_relu")
    with torch.no_grad():
        module = torch.export.export(model, inputs, strict=False).module()
    off, on = qnn_rows.lower_rows("conv_bn_relu", module, inputs, "fp16", ("off", "on"))
    assert off.status.startswith("mismatch: max abs diff vs eager"), off.status
    assert off.mismatch_cause.startswith("executorch 1.5.1: QNN's BatchNorm builder"), off.mismatch_cause
    assert on.status == "ok", (on.status, on.traceback)
    assert on.htp_max_abs_diff <= on.tolerance and on.tolerance_rule, on.tolerance_rule
    assert on.htp_vs_off_max_abs_diff > FAR * on.tolerance
    assert on.pte_bytes <= off.pte_bytes
