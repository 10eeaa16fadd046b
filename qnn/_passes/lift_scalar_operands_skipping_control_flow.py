"""`LiftScalarOperandsSkippingControlFlow`: QNN's ``LiftConstantScalarOperands`` for programs
that call control flow.

executorch 1.5.1's pass (backends/qualcomm/_passes/lift_constant_scalar_operands.py) reads
``node.target._schema`` of every call, and a higher-order op (``torch.cond``, ``map``, ``scan``,
``while_loop``) has none: ``'CondOp' object has no attribute '_schema'``. The change is the
shape of executorch PR 22252 ("skip higher-order ops in LiftConstantScalarOperands").
It overrides the private ``_create_tensor_args``; the pass and that method are
`qnn.executorch_internals`' (pinned by tests/qnn/test_executorch_internals.py).
"""

from __future__ import annotations

import torch

from ..control_flow import calls_control_flow
from ..executorch_internals import LiftConstantScalarOperands


class LiftScalarOperandsSkippingControlFlow(LiftConstantScalarOperands):
    """QNN's ``LiftConstantScalarOperands`` (_passes/lift_constant_scalar_operands.py), which
    turns scalar operands into tensor constants for QNN's op builders, except for higher-order
    ops: their operands are tensors and bodies, and they have no ``_schema`` to read."""

    def _create_tensor_args(self, node: torch.fx.Node, gm: torch.fx.GraphModule) -> dict:
        if calls_control_flow(node):
            return {}
        return super()._create_tensor_args(node, gm)
