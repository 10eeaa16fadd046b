"""Finding a stored tensor with the same bytes as a new value, so it is stored once."""

from __future__ import annotations

from typing import Optional

import torch

from .sizes import content_digest, is_subclass


class IdenticalTensors:
    """Finds a stored tensor with the same dtype, shape and bytes as a given one.

    Each tensor is hashed at most once, and only when another tensor has its dtype and shape
    (most weights differ in shape). Tensor subclasses (torchao's quantized weights) are never
    matched.
    """

    def __init__(self, existing: dict[object, Optional[torch.Tensor]]) -> None:
        """`existing`: {owner: stored tensor or None}, e.g. the program's constant placeholders."""
        self._pending: dict[tuple, list[tuple[object, torch.Tensor]]] = {}
        self._by_digest: dict[tuple, object] = {}
        self._last: tuple = (None, ())
        for owner, t in existing.items():
            if t is not None and not is_subclass(t):
                self._pending.setdefault(_shape_key(t), []).append((owner, t))

    def find(self, t: torch.Tensor) -> Optional[object]:
        """The owner storing the same bytes as `t`, or None; remembers `t`'s digest for `add`."""
        if is_subclass(t):
            return None
        key = _shape_key(t)
        for owner, other in self._pending.pop(key, ()):
            self._by_digest.setdefault(key + (content_digest(other),), owner)
        self._last = (t, key + (content_digest(t),))
        return self._by_digest.get(self._last[1])

    def add(self, owner: object, t: torch.Tensor) -> None:
        """Record that `owner` stores `t` (for later `find` calls)."""
        if is_subclass(t):
            return
        full_key = self._last[1] if self._last[0] is t else _shape_key(t) + (content_digest(t),)
        self._by_digest.setdefault(full_key, owner)


def _shape_key(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape))
