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

from dataclasses import dataclass, replace
from typing import Callable, Mapping

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


@dataclass(frozen=True)
class Preparation:
    """Makes the `Working` program of an attempt from `base`: called for the first attempt and
    whenever the next attempt needs a new one (a node was pinned in its body); an attempt redone
    for a constraint (learnt by evaluation, or a tighter growth budget) reuses the same `Working`.

    Attributes:
        base: the program being folded; never edited.
        pins: body paths of nodes that stay in their body (`hoist_body_constants`); the
            driver's dict, read at each call.
        bytes_before: stored constant bytes of the caller's program (the growth budget's
            reference).
        rewrite_readers: run `read_through_transposes` (the first round only: after a
            ``cond`` is inlined the program is the fold's own output, rewritten already).
            `fuse_into_weights` runs every round: inlining a ``cond`` brings its taken body's
            batch norms and scales to the top level (the first round's rows stay, a later
            round's replace them by node name; the growth the earlier rounds spent counts).
        transposes, notes, fusions: what the earlier rounds' rewrites found (used when they do
            not run; `fusions` merged with a later round's).
        spent: bytes of the growth budget the earlier rounds spent (`base` stores
            ``bytes_before + spent``), in bytes.
        analyze: `analysis.analyze`, for the hoisting's analyses of bodies (the driver passes
            it: a stage never imports another).
    """

    base: ExportedProgram
    policy: FoldPolicy
    clone_op: object
    pins: Mapping[str, object]
    bytes_before: int
    timer: PhaseTimer
    analyze: Callable
    rewrite_readers: bool = True
    transposes: frozenset = frozenset()
    notes: tuple[str, ...] = ()
    fusions: FusionRows = FusionRows()
    spent: int = 0

    def __call__(self) -> Working:
        with self.timer.phase("rewrites"):
            if self.rewrite_readers:
                fusion = fuse_into_weights(self.base, self.policy, self.bytes_before)
                rewrite = read_through_transposes(fusion.program, self.policy, self.bytes_before)
                rewrite = Rewrite(rewrite.program, fusion.notes + rewrite.notes, rewrite.transposes)
            else:  # batch norms and scales a ``cond``'s inlining brought to the top level
                fusion = _merged(self.fusions, fuse_into_weights(self.base, self.policy, self.bytes_before, self.spent))
                rewrite = Rewrite(fusion.program, self.notes + fusion.notes, self.transposes)
            program, split = split_returned_dequantizes(rewrite.program, inplace=rewrite.program is not self.base)
        with self.timer.phase("bodies"):  # edits the graph in place only when a rewrite copied it
            hoisting = hoist_body_constants(program, self.policy, self.clone_op, self.pins,
                                            analyze=self.analyze, inplace=program is not self.base)
        return Working(hoisting.program, hoisting.owned, rewrite.transposes, rewrite.notes + split,
                       hoisting.decisions, fusions=fusion.rows)

    def after_inlining(self, folded: ExportedProgram, last: Working, bytes_after: int) -> "Preparation":
        """The preparation of the next round, which folds `folded` (the result of the round
        whose working program was `last`, with a ``cond`` inlined since; it stores
        `bytes_after` constant bytes)."""
        return replace(self, base=folded, rewrite_readers=False, transposes=last.transposes, notes=last.notes,
                       fusions=last.fusions, spent=bytes_after - self.bytes_before)


def _merged(earlier: FusionRows, fusion: Fusion) -> Fusion:
    """`fusion` (a later round's) with the rows of the rounds before it: a later row replaces an
    earlier one of the same node name; rows for nodes an earlier round inserted (its runtime
    multiply and add, read again by the candidate search) are dropped."""
    later = [d for d in fusion.rows.decisions if d.node not in earlier.inserted]
    names = {d.node for d in later}
    rows = FusionRows(tuple(d for d in earlier.decisions if d.node not in names) + tuple(later),
                      earlier.inserted | fusion.rows.inserted)
    return Fusion(fusion.program, fusion.notes, rows, fusion.replaced)
