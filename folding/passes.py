"""`FoldConstantsPass`: the stage as an executorch `ExportedProgramPassBase`."""

from __future__ import annotations

from typing import Optional

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram

from .checks import check_folded
from .fold import fold_constants
from .policy import FoldPolicy
from .report import FoldReport


class FoldConstantsPass(ExportedProgramPassBase):
    """Runs `fold_constants` inside an ``ExportedProgramPassManager`` or as one of
    ``to_edge_transform_and_lower(..., transform_passes=[...])``; ATen or Edge dialect.

    ``ExportedProgramPassManager`` hands the pass a shallow copy that shares the caller's graph
    module, so the pass never folds in place: it returns a new program, which the manager
    uses. ``self.report`` holds the last run's `FoldReport`.

    ``call`` checks the folded program (`checks.check_folded`: graph lint and torch's signature
    verifier), so a broken rewrite fails here, not stages later. ``ensures`` is not overridden:
    ``ExportedProgramPassBase.__call__`` hands it the pass's input program
    (executorch/exir/pass_base.py), which this pass leaves as it was, stale specs included.

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
