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

    ``ensures`` checks the invariants a broken rewrite would violate (signature and placeholders
    one to one, unique node names, a linted graph); it runs on the folded program inside
    ``call`` so a broken rewrite fails here, not stages later.

    Raises:
        FoldInvariantError: from ``ensures``.
    """

    def __init__(self, policy: Optional[FoldPolicy] = None) -> None:
        super().__init__()
        self.policy = policy or FoldPolicy()
        self.report: Optional[FoldReport] = None

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        result = fold_constants(exported_program, self.policy)
        self.report = result.report
        self.ensures(result.program)
        return ExportedProgramPassResult(result.program, modified=bool(result.report.folded))

    def ensures(self, exported_program: ExportedProgram) -> None:
        """`checks.check_folded`: raises `FoldInvariantError` when the result fails graph lint
        or torch's signature verifier."""
        check_folded(exported_program)
