"""Copy ops: which op copies a tensor in a program's dialect, and which ops are such copies."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from .executorch_internals import edge_ops
from .ops import packet_name

# The copy ops of both dialects, by overload packet: ATen ``clone`` and Edge's
# ``dim_order_ops._clone_dim_order`` (executorch/exir/passes/dim_order_ops_registry.py).
CLONE_PACKETS = frozenset({"aten.clone", "dim_order_ops._clone_dim_order"})


def is_clone(target: Any) -> bool:
    """`target` (an ATen or Edge op) is a copy op of either dialect (`CLONE_PACKETS`)."""
    return packet_name(target) in CLONE_PACKETS


def clone_op_of(program: ExportedProgram):
    """The copy op for a constant output, in the program's dialect: ATen ``clone``; in Edge,
    ``dim_order_ops._clone_dim_order`` unless the program's verifier was built with
    ``EdgeCompileConfig(_skip_dim_order=True)`` (executorch/exir/verification/verifier.py)."""
    if getattr(program, "dialect", "ATEN") != "EDGE":
        return torch.ops.aten.clone.default
    exir_ops = edge_ops()
    use_dim_order = True
    for verifier in program.verifiers:
        try:
            use_dim_order = getattr(verifier(), "use_dim_order", use_dim_order)
        except TypeError:  # a verifier class that needs arguments: keep the executorch default
            pass
    if use_dim_order:
        return exir_ops.edge.dim_order_ops._clone_dim_order.default
    return exir_ops.edge.aten.clone.default
