"""A custom op only the runtime can run, for the ``fold_time_error`` family
(`families.fold_time_error`): ``fuzz_device::row_sum(Tensor x) -> Tensor`` returns ``x.sum(0)``,
but raises while a fold runs (`at_fold_time`), as a kernel needing a device only the runtime
has would. The fold keeps it (``Reason.EVALUATION_ERROR``) and stores its folded inputs in its
place; the growth budget and ``max_tensor_bytes`` must hold all the same (issue 52).

`program.HEADER` imports this module, so a reproducer registers the op too, and folds through
`at_fold_time` (`reproduce`), as the harness does (`check.Case`)."""

from __future__ import annotations

import functools
from typing import Callable

import torch

_FOLDING = [0]  # folds running now


@torch.library.custom_op("fuzz_device::row_sum", mutates_args=())
def row_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` (x: float, at least 1-D); raises RuntimeError inside `at_fold_time`."""
    if _FOLDING[0]:
        raise RuntimeError("fuzz_device::row_sum runs on the device only, not while folding")
    return x.sum(0)


@row_sum.register_fake
def _(x):
    return x.new_empty(x.shape[1:])


def at_fold_time(fold: Callable) -> Callable:
    """`fold` (``folding.fold_constants``), with `row_sum` raising while it runs."""

    @functools.wraps(fold)
    def folding(*args, **kwargs):
        _FOLDING[0] += 1
        try:
            return fold(*args, **kwargs)
        finally:
            _FOLDING[0] -= 1

    return folding
