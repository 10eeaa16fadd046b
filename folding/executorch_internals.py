"""Every executorch internal `folding` depends on, in one place, each with the executorch 1.5.1
source it reads (as `folding.torch_internals` is for torch and `qnn.executorch_internals` for
the QNN integration).

"Internal" here: a module with a private path segment (``executorch.exir.dialects._ops``) or a
private attribute of an executorch class. Each has a test in
``tests/test_executorch_internals.py`` that fails when an executorch upgrade changes it; no
other ``folding`` module imports a private executorch module or reads these attributes
(``tests/test_architecture.py``). executorch is imported on first use, so ``import folding``
does not import it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["edge_ops", "edge_overload_aten", "edge_packet_name"]


def edge_ops():
    """executorch's Edge-dialect op namespace: ``edge_ops().edge.aten.clone.default`` is the
    `EdgeOpOverload` of ``aten.clone.default`` (exir/dialects/_ops.py ``ops``, the object
    executorch's own passes import as ``exir_ops``; no public module exports it)."""
    from executorch.exir.dialects._ops import ops

    return ops


def edge_overload_aten(target: Any) -> Optional[torch._ops.OpOverload]:
    """The ATen `OpOverload` an Edge-dialect `EdgeOpOverload` wraps (its ``_op``, set in
    ``EdgeOpOverload.__init__``, exir/dialects/edge/_ops.py), or None for any other target.
    (torch's own ``OpOverload`` also has an ``_op``: the C++ callable, not an OpOverload.)"""
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, torch._ops.OpOverload) else None


def edge_packet_name(target: Any) -> Optional[str]:
    """The name of an Edge-dialect overload packet (`EdgeOpOverloadPacket`, such as
    ``exir_ops.edge.aten.full``) as torch prints a packet (``aten.full``): its
    ``_qualified_op_name`` (``"aten::full"``, set in ``EdgeOpOverloadPacket.__init__``,
    exir/dialects/edge/_ops.py) with ``::`` as ``.``; None for a target without one."""
    qualified = getattr(target, "_qualified_op_name", None)
    return qualified.replace("::", ".") if isinstance(qualified, str) else None
