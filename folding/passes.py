"""`FoldConstantsPass`: the stage as an executorch `ExportedProgramPassBase`."""

from __future__ import annotations

from typing import Optional

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram

from .core.checks import check_folded
from .fold import fold_constants
from .policy import FoldPolicy
from .report import FoldReport


class FoldConstantsPass(ExportedProgramPassBase):
    """Runs `fold_constants` in an ``ExportedProgramPassManager`` or as one of
    ``to_edge_transform_and_lower(..., transform_passes=[...])``; ATen or Edge dialect.

    Never folds in place (the manager hands over a shallow copy sharing the caller's graph
    module): it returns a new program. ``self.report`` holds the last run's `FoldReport`.
    ``call`` checks the folded program (`checks.check_folded`); ``ensures`` is not overridden,
    as ``ExportedProgramPassBase.__call__`` hands it the pass's input (exir/pass_base.py).

    Raises:
        FoldInvariantError: the folded program fails those checks.
    """

    def __init__(self, policy: Optional[FoldPolicy] = None) -> None:
        super().__init__()
        self.policy = policy or FoldPolicy()
        self.report: Optional[FoldReport] = None

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        result = fold_constants(exported_program, self.policy)
        self.report = result.report
        check_folded(result.program)
        return ExportedProgramPassResult(result.program, modified=bool(result.report.folded))
