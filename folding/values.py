"""What a node's value is: a tensor, a sequence of tensors, or a (symbolic) scalar."""

from __future__ import annotations

from typing import Any

import torch

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_scalar(val: Any) -> bool:
    """A Python or symbolic scalar (the value of ``item()``, ``sym_size``, ``operator.ge`` …)."""
    return isinstance(val, (int, float, bool) + SYM_TYPES)


def holds_tensors(val: Any) -> bool:
    """A tensor, or a non-empty list/tuple of tensors and Nones with at least one tensor (the
    results of multi-output ops, which `getitem` nodes read); what folding can store."""
    if isinstance(val, torch.Tensor):
        return True
    return (isinstance(val, (list, tuple)) and all(v is None or isinstance(v, torch.Tensor) for v in val)
            and any(isinstance(v, torch.Tensor) for v in val))


def tensors_in(val: Any) -> list[torch.Tensor]:
    """The tensors of an op's result: itself, or those of a (nested) list or tuple."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in tensors_in(v)]
    return []
