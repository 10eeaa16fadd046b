"""Every executorch internal `folding` reads (a private module path or attribute), each with
the executorch 1.5.1 source it reads and a test in ``tests/test_executorch_internals.py``.
executorch is imported on first use, so ``import folding`` does not import it."""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["edge_ops", "edge_overload_aten", "edge_packet_name"]


def edge_ops():
    """executorch's Edge-dialect op namespace (exir/dialects/_ops.py ``ops``, which executorch's
    passes import as ``exir_ops``): ``edge_ops().edge.aten.clone.default``."""
    from executorch.exir.dialects._ops import ops

    return ops


def edge_overload_aten(target: Any) -> Optional[torch._ops.OpOverload]:
    """The ATen `OpOverload` an `EdgeOpOverload` wraps (its ``_op``, exir/dialects/edge/_ops.py),
    or None for any other target (torch's own ``OpOverload._op`` is not an OpOverload)."""
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, torch._ops.OpOverload) else None


def edge_packet_name(target: Any) -> Optional[str]:
    """An `EdgeOpOverloadPacket`'s name as torch prints a packet (``aten.full``), from its
    ``_qualified_op_name`` (``"aten::full"``, exir/dialects/edge/_ops.py); None without one."""
    qualified = getattr(target, "_qualified_op_name", None)
    return qualified.replace("::", ".") if isinstance(qualified, str) else None
