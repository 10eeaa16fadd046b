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
