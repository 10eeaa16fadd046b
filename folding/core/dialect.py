"""The op that stands for an ATen overload in a program's dialect (ATen or Edge)."""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch.export import ExportedProgram

from .executorch_internals import edge_ops

# ATen view ops that Edge holds as their copying variant (``to_edge`` functionalizes views:
# torch/_export/passes/replace_view_ops_with_view_copy_ops_pass.py).
_EDGE_VIEW_COPIES = {"aten.view.default": "aten.view_copy.default",
                     "aten.expand.default": "aten.expand_copy.default",
                     "aten.permute.default": "aten.permute_copy.default"}
# Copies that Edge holds as dim order ops unless its verifier skips dim order
# (executorch/exir/passes/dim_order_ops_registry.py ``DimOrderOpsMap``).
_EDGE_DIM_ORDER = {"aten.clone.default": "dim_order_ops._clone_dim_order.default",
                   "aten._to_copy.default": "dim_order_ops._to_dim_order_copy.default"}


def dialect_op(program: ExportedProgram, name: str) -> Optional[Any]:
    """The op for the ATen overload `name` (``"aten.view.default"``) in `program`'s dialect, or
    None when the dialect has no such op (``aten.conv2d`` in Edge).

    Edge: the op ``to_edge`` puts in its place: a view op's copying variant; ``clone`` and
    ``_to_copy`` as dim order ops unless the verifier has ``_skip_dim_order=True``
    (executorch/exir/verification/verifier.py); any other the Edge op of the same name.
    """
    if getattr(program, "dialect", "ATEN") != "EDGE":
        return _op(False, name)
    name = _EDGE_VIEW_COPIES.get(name, name)
    if name in _EDGE_DIM_ORDER and _uses_dim_order(program):
        name = _EDGE_DIM_ORDER[name]
    return _op(True, name)


def _uses_dim_order(program: ExportedProgram) -> bool:
    use_dim_order = True
    for verifier in program.verifiers:
        try:
            use_dim_order = getattr(verifier(), "use_dim_order", use_dim_order)
        except TypeError:  # a verifier class that needs arguments: keep the executorch default
            pass
    return use_dim_order


@functools.lru_cache(maxsize=4096)
def _op(edge: bool, name: str) -> Optional[Any]:
    namespace = edge_ops().edge if edge else torch.ops
    space, packet, overload = name.split(".")
    try:
        return getattr(getattr(getattr(namespace, space), packet), overload)
    except (AttributeError, RuntimeError):
        return None
