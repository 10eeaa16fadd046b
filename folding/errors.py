"""Errors raised by the folding stage: each names the node (or program part) and the reason."""


class FoldingError(Exception):
    """Base class of every error this package raises."""


class InvalidProgramError(FoldingError):
    """The input is not a program the stage can fold (wrong type, broken signature)."""


class FoldInvariantError(FoldingError):
    """A rewrite produced a program that breaks an invariant of docs/design.md (a bug here)."""


class PolicyError(FoldingError, ValueError):
    """A `FoldPolicy` field or a command-line size has an invalid value."""


class FoldInternalError(FoldingError):
    """An unexpected exception inside the stage (a bug here), chained as ``__cause__``."""
