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
    """The program still calls a control-flow higher-order op (``cond`` on a runtime predicate,
    ``map``, ``scan``, a loop on runtime values) that QNN's passes in executorch 1.5.1 cannot
    process: ``LiftConstantScalarOperands`` (backends/qualcomm/_passes/
    lift_constant_scalar_operands.py, in the export, annotation and to-edge pipelines) reads
    ``node.target._schema`` of every call_function node, and higher-order ops have no schema
    (``AttributeError: 'CondOp' object has no attribute '_schema'``). With that pass made to
    skip higher-order ops (executorch PR 22252's shape), the to-edge pass ``I64toI32``
    (_passes/i64_to_i32.py, through builders/utils.py ``is_constant``) fails next: it reads
    ``meta["val"]`` of the ``get_attr`` of each body, which has none
    (tests/qnn/test_control_flow_qnn.py pins both)."""


class QnnSdkError(QnnFoldingError, RuntimeError):
    """The QNN HTP libraries are missing, do not load, or are a QNN build executorch 1.5.1
    cannot use (qnn/sdk.py); the message says what to install."""
