"""Which programs XNNPACK's kernels are not held to eager on: those that compute on extreme values.

XNNPACK's kernels (executorch 1.5.1) match eager on ordinary floats but not at the edges of the
float range, folded or not (`tests/test_executorch_upstream.py` pins each):

- ``sqrt(inf)`` and ``rsqrt(0)`` give NaN (eager: inf); ``rsqrt(-0.0)`` NaN (eager: -inf);
- ``log`` and ``ceil`` flush subnormal inputs to zero;
- ``sigmoid(1e30)`` and ``sin(1e30)`` give NaN.

A cond with a constant predicate that folding inlines hands its branch to XNNPACK where the
unfolded program ran it on portable kernels inside the cond; a mask of ``-inf`` in such a branch
then turns into a "wrong" XNNPACK output that is XNNPACK's and not the fold's. The fuzzer
therefore accepts an XNNPACK output that differs from eager only when the folded program's
portable .pte matched, and the folded program itself (run eagerly) feeds one of those ops
(`KERNELS`) such a value at the top level: `first_extreme_read` names the first.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# Beyond this magnitude XNNPACK's range reductions (sin, sigmoid) stop matching eager.
HUGE = 1e18

# The ops whose XNNPACK kernels differ from eager on extreme inputs (each pinned in
# tests/test_executorch_upstream.py); ``rsqrt`` also differs at zero.
KERNELS = frozenset({"aten.sqrt.default", "aten.rsqrt.default", "aten.log.default", "aten.ceil.default",
                     "aten.sigmoid.default", "aten.sin.default"})


def _extreme(t: torch.Tensor, zero: bool = False) -> Optional[str]:
    """What makes `t` extreme (non-finite, subnormal, beyond `HUGE`; zero when `zero`), or None."""
    if not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
        return None
    v = t.detach().float()
    if not torch.isfinite(v).all():
        return "a non-finite value"
    a = v.abs()
    if bool(((a > 0) & (a < torch.finfo(t.dtype).tiny)).any()):
        return "a subnormal value"
    if bool((a > HUGE).any()):
        return f"a value beyond {HUGE:g}"
    if zero and bool((a == 0).any()):
        return "a zero"
    return None


class _Watch(TorchDispatchMode):
    """Records the first op of `KERNELS` that reads an extreme float tensor. A higher-order op
    runs unwatched: executorch lowers the top-level graph to XNNPACK, and a control-flow body
    stays on portable kernels."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.first: Optional[str] = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if self.first is None and name in KERNELS:
            for leaf in pytree.tree_leaves((args, kwargs)):
                why = _extreme(leaf, zero=name == "aten.rsqrt.default") if isinstance(leaf, torch.Tensor) else None
                if why:
                    self.first = f"{func} reads {why}"
                    break
        return func(*args, **kwargs)


def first_extreme_read(module: torch.nn.Module, calls: Sequence[Sequence[torch.Tensor]]) -> Optional[str]:
    """Run `module` on each input tuple in turn (state carries over, RNG seeded as the fuzzer's
    `run_twice` does) and return which op of `KERNELS` first read an extreme value, or None."""
    watch = _Watch()
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        for seed, inputs in enumerate(calls):
            torch.manual_seed(seed)
            with watch:
                module(*inputs)
            if watch.first is not None:
                return watch.first
    return None
