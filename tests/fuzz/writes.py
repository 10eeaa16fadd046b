"""A custom op that writes a stored tensor without declaring it, for the ``undeclared_write``
family (`families.undeclared_write`): ``fuzz_writes::bump(Tensor w, Tensor x) -> Tensor`` adds
1 to ``w`` in place (its schema says ``Tensor w``, not ``Tensor(a!) w``) and returns
``x + w.sum()``. No table of `folding.core.ops` can know it; evaluation must catch the write on a
copy and never let it reach the caller's parameter, buffer or constant (issue 52).

`program.HEADER` imports this module, so a reproducer registers the op too. The registration
lives as long as the module (a `torch.library.Library` unregisters what it defined when it is
collected)."""

from __future__ import annotations

import torch

_lib = torch.library.Library("fuzz_writes", "DEF")
_lib.define("bump(Tensor w, Tensor x) -> Tensor")


def _bump(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # a parameter is written as a buffer would be
        w.add_(1)
    return x + w.sum().to(x.dtype)


_lib.impl("bump", _bump, "CompositeExplicitAutograd")
_lib.impl("bump", lambda w, x: torch.empty_like(x), "Meta")
