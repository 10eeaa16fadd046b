"""Which ops copy a tensor, in either dialect."""

from __future__ import annotations

from typing import Any

from .ops import packet_name

# The copy ops of both dialects, by overload packet: ATen ``clone`` and Edge's
# ``dim_order_ops._clone_dim_order`` (executorch/exir/passes/dim_order_ops_registry.py).
CLONE_PACKETS = frozenset({"aten.clone", "dim_order_ops._clone_dim_order"})


def is_clone(target: Any) -> bool:
    """`target` (an ATen or Edge op) is a copy op of either dialect (`CLONE_PACKETS`)."""
    return packet_name(target) in CLONE_PACKETS

