"""Constant folding for ExecuTorch programs.

Folds every constant-only subgraph of an ``ExportedProgram`` into lifted constants before
partitioning, so no backend partition is left reading only weights and buffers.

    from folding import fold_constants
    result = fold_constants(exported_program)
    result.program, result.report
"""

from .errors import FoldingError, FoldInternalError, FoldInvariantError, InvalidProgramError, PolicyError
from .fold import FoldResult, fold_constants
from .names import reserve_node_names
from .passes import FoldConstantsPass
from .policy import FoldPolicy
from .report import Decision, FoldReport, LiftedConstant, Reason

__all__ = [
    "Decision",
    "FoldConstantsPass",
    "FoldInternalError",
    "FoldInvariantError",
    "FoldPolicy",
    "FoldReport",
    "FoldResult",
    "FoldingError",
    "InvalidProgramError",
    "LiftedConstant",
    "PolicyError",
    "Reason",
    "fold_constants",
    "reserve_node_names",
]
