"""The program one fold attempt analyses and lifts: the program being folded after the
rewrites that come before analysis (`weight_fusion.fuse_into_weights`,
`transposed_gathers.read_through_transposes`,
`returned_dequantizes.split_returned_dequantizes`, then `bodies.hoist_body_constants`).

The program being folded is never edited. The first of these rewrites that applies copies
its top-level graph (`hops.copy_uncompiled`: tensors and bodies shared); the ones after it
edit that copy. When none applies, the working program is the program being folded itself:
analysis, planning, evaluation and placement only read it, and `lift` builds the folded
program's graph anew from its surviving nodes. So an attempt copies the whole top-level graph
only when a rewrite applies, and the working program outlives its attempts: an attempt
discarded after `lift` (over the growth budget) is redone on the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch.export import ExportedProgram

from .bodies import hoist_body_constants
from .returned_dequantizes import split_returned_dequantizes
from .policy import FoldPolicy
from .transposed_gathers import Rewrite, read_through_transposes
from .weight_fusion import Fusion, FusionRows, fuse_into_weights
from .report import PhaseTimer


@dataclass(frozen=True)
class Working:
    """Attributes:
        program: what the attempt folds, read only from here on: a copy the rewrites made, or
            the program being folded itself when none applied.
        owned_bodies: the body GraphModules this attempt made (`bodies.Hoisting.owned`).
        transposes: names of the transposes that replace their matrix when folded
            (`transposed_gathers.Rewrite.transposes`).
        notes: one line per rewritten gather and per dequantize copied for the output
            (`FoldReport.rewrites`).
        body_decisions: why each node left in a body stays (`bodies.Hoisting.decisions`).
        fusions: the report rows of `weight_fusion.fuse_into_weights` (`Fusion.rows`).
    """

    program: ExportedProgram
    owned_bodies: frozenset
    transposes: frozenset
    notes: tuple[str, ...]
    body_decisions: tuple = ()
    fusions: FusionRows = FusionRows()


def prepare(base: ExportedProgram, policy: FoldPolicy, clone_op, bytes_before: int, timer: PhaseTimer, analyze: Callable,
            last: Optional[Working] = None, spent: int = 0) -> Working:
    """The `Working` program of a round, made from `base`, the program it folds (never edited).

    Args:
        clone_op: the program dialect's copy op (`hoist_body_constants`).
        bytes_before: stored constant bytes of the caller's program (the growth budget's
            reference).
        analyze: `analysis.analyze`, for the hoisting's analyses of bodies (the driver passes
            it: a stage never imports another).
        last: the working program of the round before, when `base` is that round's result with
            a ``cond`` inlined since. `read_through_transposes` then does not run (`base` is
            rewritten already; its transposes and notes carry over); `fuse_into_weights` runs
            every round, on what the inlined body brought to the top level (the earlier rows
            stay, a later round's replace them by node name).
        spent: bytes of the growth budget the earlier rounds spent (`base` stores
            ``bytes_before + spent``).
    """
    with timer.phase("rewrites"):
        if last is None:
            fusion = fuse_into_weights(base, policy, bytes_before)
            rewrite = read_through_transposes(fusion.program, policy, bytes_before)
            rewrite = Rewrite(rewrite.program, fusion.notes + rewrite.notes, rewrite.transposes)
        else:
            fusion = _merged(last.fusions, fuse_into_weights(base, policy, bytes_before, spent))
            rewrite = Rewrite(fusion.program, last.notes + fusion.notes, last.transposes)
        program, split = split_returned_dequantizes(rewrite.program, inplace=rewrite.program is not base)
    with timer.phase("bodies"):  # edits the graph in place only when a rewrite copied it
        hoisting = hoist_body_constants(program, policy, clone_op, analyze=analyze, inplace=program is not base)
    return Working(hoisting.program, hoisting.owned, rewrite.transposes, rewrite.notes + split,
                   hoisting.decisions, fusions=fusion.rows)


def _merged(earlier: FusionRows, fusion: Fusion) -> Fusion:
    """`fusion` (a later round's) with the rows of the rounds before it: a later row replaces an
    earlier one of the same node name; rows for nodes an earlier round inserted (its runtime
    multiply and add, read again by the candidate search) are dropped."""
    later = [d for d in fusion.rows.decisions if d.node not in earlier.inserted]
    names = {d.node for d in later}
    rows = FusionRows(tuple(d for d in earlier.decisions if d.node not in names) + tuple(later),
                      earlier.inserted | fusion.rows.inserted)
    return Fusion(fusion.program, fusion.notes, rows, fusion.replaced)
