"""The program one fold attempt analyses and lifts: the program being folded after the
rewrites that come before analysis (`weight_fusion.fuse_into_weights`,
`transposed_gathers.read_through_transposes`,
`returned_dequantizes.split_returned_dequantizes`, then `bodies.hoist_body_constants`), in a
top-level graph the attempt owns.

The program being folded is never edited. The first of these rewrites that applies copies
its top-level graph; the ones after it edit that copy, and so does `lift`. When none applies,
prepare copies the top-level graph itself (`hops.copy_uncompiled`: tensors and bodies
shared): either way, the top-level graph is copied once per attempt that reaches `lift`. An
attempt that lifted its working program and is then discarded (over the growth budget)
prepares a new one: the rewrites are deterministic, so it is the same program again.

One exception, for ``fold_constants(..., inplace=True)``: when no rewrite applies, the program
has no control-flow body and declares no mutated state, the attempt works on the program being
folded itself (`Working.shares_base`) and `lift` edits the caller's graph, with no copy. The
driver lets such an attempt lift only when no in-place op is in the graph and the growth
budget holds even if nothing the fold stores were shared (`Placement.added_bytes_bound`) or,
failing that quick bound, with only what `lift` drops counted as saved
(`Placement.stored_bytes_bound`): then nothing can discard it after `lift`. Otherwise it is
redone on a copy (`Preparation.copying`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

from torch.export import ExportedProgram

from .bodies import has_bodies, hoist_body_constants
from .hops import copy_uncompiled
from .returned_dequantizes import split_returned_dequantizes
from .policy import FoldPolicy
from .signature import mutated_targets
from .transposed_gathers import Rewrite, read_through_transposes
from .weight_fusion import Fusion, FusionRows, fuse_into_weights
from .report import PhaseTimer
from .torch_internals import program_with


@dataclass(frozen=True)
class Working:
    """Attributes:
        program: what the attempt folds; its top-level GraphModule is a copy this attempt
            made, which `lift` edits.
        owned_bodies: the body GraphModules this attempt made (`bodies.Hoisting.owned`).
        transposes: names of the transposes that replace their matrix when folded
            (`transposed_gathers.Rewrite.transposes`).
        notes: one line per rewritten gather and per dequantize copied for the output
            (`FoldReport.rewrites`).
        body_decisions: why each node left in a body stays (`bodies.Hoisting.decisions`).
        fusions: the report rows of `weight_fusion.fuse_into_weights` (`Fusion.rows`).
        shares_base: `program` is the program being folded, not a copy (in place only; see
            the module docstring): `lift` edits the caller's graph.
    """

    program: ExportedProgram
    owned_bodies: frozenset
    transposes: frozenset
    notes: tuple[str, ...]
    body_decisions: tuple = ()
    shares_base: bool = False
    fusions: FusionRows = FusionRows()


@dataclass(frozen=True)
class Preparation:
    """Makes the `Working` program of an attempt from `base`: called for the first attempt and
    whenever the next attempt needs a new one (the last one lifted its working program and was
    discarded, a node was pinned in its body, or the fold moves to a copy); an attempt redone for
    a constraint learnt before `lift` reuses the same `Working`.

    Attributes:
        base: the program being folded; never edited.
        pins: body paths of nodes that stay in their body (`hoist_body_constants`); the
            driver's dict, read at each call.
        bytes_before: stored constant bytes of the caller's program (the growth budget's
            reference).
        rewrite_readers: run `fuse_into_weights` and `read_through_transposes` (the first round
            only: after a ``cond`` is inlined the program is the fold's own output, rewritten
            already).
        transposes, notes, fusions: what the first round's rewrites found (used when they do
            not run).
        analyze: `analysis.analyze`, for the hoisting's analyses of bodies (the driver passes
            it: a stage never imports another).
        may_share_base: the fold is in place, so an attempt may work on `base` itself when
            nothing rewrites it (module docstring).
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
    may_share_base: bool = False
    fusions: FusionRows = FusionRows()

    def __call__(self) -> Working:
        with self.timer.phase("rewrites"):
            if self.rewrite_readers:
                fusion = fuse_into_weights(self.base, self.policy, self.bytes_before)
                rewrite = read_through_transposes(fusion.program, self.policy, self.bytes_before)
                rewrite = Rewrite(rewrite.program, fusion.notes + rewrite.notes, rewrite.transposes)
            else:
                fusion = Fusion(self.base, (), self.fusions)
                rewrite = Rewrite(self.base, self.notes, self.transposes)
            program, split = split_returned_dequantizes(rewrite.program, inplace=rewrite.program is not self.base)
            shares = program is self.base and self.may_share_base and not has_bodies(program.graph_module) \
                and not mutated_targets(program.graph_signature)
            if program is self.base and not shares:  # the attempt's own copy, for `bodies` and `lift`
                program = program_with(program, graph_module=copy_uncompiled(program.graph_module)[0])
        with self.timer.phase("bodies"):
            hoisting = hoist_body_constants(program, self.policy, self.clone_op, self.pins,
                                            analyze=self.analyze, inplace=True)
        return Working(hoisting.program, hoisting.owned, rewrite.transposes, rewrite.notes + split,
                       hoisting.decisions, shares_base=shares, fusions=fusion.rows)

    def copying(self) -> "Preparation":
        """This preparation, with every attempt on a copy (`Working.shares_base` never set)."""
        return replace(self, may_share_base=False)

    def after_inlining(self, folded: ExportedProgram, last: Working) -> "Preparation":
        """The preparation of the next round, which folds `folded` (the result of the round
        whose working program was `last`, with a ``cond`` inlined since)."""
        return replace(self, base=folded, rewrite_readers=False, transposes=last.transposes, notes=last.notes,
                       may_share_base=False, fusions=last.fusions)
