"""Errors raised by the QNN integration (all are `folding.FoldingError`s)."""

from __future__ import annotations

from folding import FoldingError


class QnnFoldingError(FoldingError):
    """Base class of the errors this package raises."""


class CompileSpecError(QnnFoldingError, ValueError):
    """The ``fold_constants`` compile spec is malformed (wrong value, duplicated key)."""


class EncodingLostError(QnnFoldingError):
    """A folded integer constant reached QNN's partitioner without the encoding QNN reads from
    its dequantize: QNN's to-edge passes were bound to a program object other than the folded
    one (see docs/design.md, "Where the stage runs"), so ``FoldQDQ`` deleted the dequantize and HTP
    would receive raw integers as floats."""


class ControlFlowNotSupportedError(QnnFoldingError):
    """QNN's quantizer was given a program that calls a control-flow higher-order op (``cond``,
    ``map``, ``scan``, ``while_loop``). ``QnnQuantizer.transform_for_annotation`` builds
    executorch's own pass manager, whose ``LiftConstantScalarOperands``
    (backends/qualcomm/_passes/lift_constant_scalar_operands.py) reads ``node.target._schema``
    of every call, and higher-order ops have no schema (``AttributeError: 'CondOp' object has
    no attribute '_schema'``). Lowering such a program is supported (`qnn.pass_manager_cls`);
    quantizing it is not (tests/qnn/test_control_flow_qnn.py)."""


class QnnSdkError(QnnFoldingError, RuntimeError):
    """The QNN HTP libraries are missing, do not load, or are a QNN build executorch 1.5.1
    cannot use (qnn/sdk.py); the message says what to install."""
