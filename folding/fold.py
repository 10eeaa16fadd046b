"""`fold_constants`: the driver, the only module that imports its steps: check → prepare →
analyze → plan → evaluate → place → lift → measure → report, then sink and inline between
rounds (docs/design.md, "Pipeline inside `fold_constants`")."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from .core.analysis import analyze
from .core.checks import check_signature, check_stored_tensors, with_output_names
from .control_flow.bodies import hoist_body_constants, sink_kept_code
from .control_flow.hops import recompile_shallow, unprobed_writes
from .control_flow.inline import Inlining, inline_constant_conds
from .errors import FoldingError, FoldInternalError, InvalidProgramError, PolicyError
from .core.evaluate import UndeclaredWrite, evaluate
from .core.dialect import dialect_op
from .core.lift import lift
from .core.nonfinite import NonfiniteScan
from .core.outcome import folded_and_kept
from .core.placement import place
from .core.plan import make_plan
from .policy import FoldPolicy
from .reasons import Reason
from .report import FoldReport, PhaseTimer
from .core.report_builder import body_decisions, fold_report, merged, with_rule_decisions
from .core.sizes import placeholder_savings, stored_constant_bytes, stored_tensor
from .core.torch_internals import replace_contents, reserve_names
from .rewrites.returned_dequantizes import split_returned_dequantizes
from .rewrites.transposed_gathers import Rewrite, read_through_transposes
from .rewrites.weight_fusion import Fusion, FusionRows, fuse_into_weights

logger = logging.getLogger(__name__)


@dataclass
class FoldResult:
    """The folded ExportedProgram (the input object itself only when ``inplace=True``) and its
    report: what was folded and kept, and why."""

    program: ExportedProgram
    report: FoldReport


def fold_constants(
    program: ExportedProgram, policy: FoldPolicy | None = None, *, inplace: bool = False
) -> FoldResult:
    """Fold every constant-only subgraph of `program` into lifted constants.

    Works on ATen-dialect programs (including torch 2.14's training IR with in-place ops) and
    Edge-dialect programs. A folded value that a kept op or the output reads becomes a
    placeholder with a ``CONSTANT_TENSOR`` InputSpec whose tensor (contiguous, detached, owning
    its storage) is in ``program.constants``, one per folded value (the serializer stores
    identical bytes once). Nodes that are not folded keep their names. Parameters, buffers and constants left
    without users are removed.

    Args:
        program: an ``ExportedProgram`` from ``torch.export.export``, ``to_edge`` or a pass.
        policy: limits and switches; ``FoldPolicy()`` when None.
        inplace: put the folded program's contents into `program` itself once the fold has
            succeeded. On any error, or when False, the caller's program is left unchanged
            (invariant 7); unchanged tensors are shared, not copied.

    Returns:
        `FoldResult` with the folded program and its `FoldReport`.

    Raises (only `FoldingError` subclasses):
        InvalidProgramError: `program` is not an ExportedProgram; its signature does not match
            its placeholders or outputs; a parameter, buffer or constant it names is missing
            from its state_dict/constants, is not a tensor, holds no data (a fake or meta
            tensor), or differs from its placeholder's ``meta["val"]`` in dtype or a static dim.
        PolicyError: `policy` is not a `FoldPolicy`.
        FoldInvariantError: the folded program failed torch's checks (a bug here).
        FoldInternalError: any other exception inside the stage (a bug here), chained.
    """
    timer = PhaseTimer()
    if not isinstance(program, ExportedProgram):
        hint = " (export it first: torch.export.export(module, inputs))" if isinstance(program, torch.nn.Module) else ""
        raise InvalidProgramError(f"fold_constants expects a torch.export.ExportedProgram, got {type(program).__name__}{hint}")
    if policy is not None and not isinstance(policy, FoldPolicy):
        raise PolicyError(f"policy must be a folding.FoldPolicy or None, got {type(policy).__name__}")
    try:  # the checks too: a program they did not foresee gives a FoldInternalError, not a raw one
        with timer.phase("checks"):
            repairs = check_signature(program)
            check_stored_tensors(program)
        result = _fold(with_output_names(program, repairs), policy or FoldPolicy(), timer)
    except FoldingError:
        raise
    except Exception as e:  # the contract: nothing but FoldingError leaves the stage
        raise FoldInternalError(f"unexpected {type(e).__name__} while folding (a bug in the folding stage, "
                                f"please report it with the program): {e}") from e
    result.report.repairs = [str(r) for r in repairs]
    if inplace:  # only a program that passed lift's checks replaces the caller's
        replace_contents(program, result.program)
        result = FoldResult(program, result.report)
    return result


@dataclass(frozen=True)
class Working:
    """What a round folds (read only): `program` after the prepare rewrites, the bodies they
    made (`Hoisting.owned`), the transposes that replace their matrix (`Rewrite.transposes`),
    the notes for `FoldReport.rewrites`, the hoisting's decisions and the fusion rows."""

    program: ExportedProgram
    owned_bodies: frozenset
    transposes: frozenset
    notes: tuple[str, ...]
    body_decisions: tuple = ()
    fusions: FusionRows = FusionRows()


def _prepare(base: ExportedProgram, policy: FoldPolicy, clone_op, bytes_before: int, timer: PhaseTimer,
             last: Optional[Working] = None, spent: int = 0) -> Working:
    """The `Working` program of a round: `base` (never edited; a copy is made by the first
    rewrite that applies) after the rewrites that come before analysis. `last`: the round
    before's, when `base` is its result with a ``cond`` inlined since (its transposes and notes
    carry over; fusion runs again, its rows replacing the earlier ones by node name); `spent`:
    bytes of the growth budget the earlier rounds spent."""
    with timer.phase("rewrites"):
        if last is None:
            fusion = fuse_into_weights(base, policy, bytes_before)
            rewrite = read_through_transposes(fusion.program, policy, bytes_before)
            rewrite = Rewrite(rewrite.program, fusion.notes + rewrite.notes, rewrite.transposes)
        else:
            fusion = _merged_rows(last.fusions, fuse_into_weights(base, policy, bytes_before, spent))
            rewrite = Rewrite(fusion.program, last.notes + fusion.notes, last.transposes)
        program, split = split_returned_dequantizes(rewrite.program, inplace=rewrite.program is not base)
    with timer.phase("bodies"):  # edits the graph in place only when a rewrite copied it
        hoisting = hoist_body_constants(program, policy, clone_op, analyze=analyze, inplace=program is not base)
    return Working(hoisting.program, hoisting.owned, rewrite.transposes, rewrite.notes + split,
                   hoisting.decisions, fusions=fusion.rows)


def _merged_rows(earlier: FusionRows, fusion: Fusion) -> Fusion:
    """`fusion` (a later round's) with the rows of the rounds before it: a later row replaces an
    earlier one of the same node name; rows for nodes an earlier round inserted are dropped."""
    later = [d for d in fusion.rows.decisions if d.node not in earlier.inserted]
    names = {d.node for d in later}
    rows = FusionRows(tuple(d for d in earlier.decisions if d.node not in names) + tuple(later),
                      earlier.inserted | fusion.rows.inserted)
    return Fusion(fusion.program, fusion.notes, rows, fusion.replaced)


def _fold(program: ExportedProgram, policy: FoldPolicy, timer: PhaseTimer) -> FoldResult:
    """Fold `program` in rounds: after each fold (`_fold_once`), a ``cond`` whose predicate became
    a stored constant is inlined and the result folded again, until nothing is inlined."""
    with timer.phase("bytes"):
        bytes_before = stored_constant_bytes(program)
    with timer.phase("bodies"):
        clone_op = dialect_op(program, "aten.clone.default")
    steps: list[FoldReport | Inlining] = []  # folds, and the inlining between them
    reserved = {n.name for n in program.graph.nodes}  # the report's names (invariant 6)
    working = _prepare(program, policy, clone_op, bytes_before, timer)
    while True:  # bound: each round removes a cond
        folded, report = _fold_once(working, policy, bytes_before, timer)
        with timer.phase("bodies"):
            if sink_kept_code(folded.graph_module):
                recompile_shallow(folded.graph_module)
        steps.append(report)
        with timer.phase("inlining"):
            inlined = inline_constant_conds(folded, clone_op, reserved)
        if not inlined:
            break
        steps.append(inlined)
        working = _prepare(folded, policy, clone_op, bytes_before, timer, working,
                           report.constant_bytes_after - bytes_before)
    reserve_names(folded.graph, reserved)  # invariant 6: a rewrite may have removed some of them
    with timer.phase("report"):
        report = merged(steps, folded)
        report.rewrites = list(working.notes)
        report.decisions.extend(body_decisions(folded, working.body_decisions))
        report.decisions = with_rule_decisions(report.decisions, working.fusions)
    report.timings = timer.timings()
    logger.info("folded %d nodes into %d lifted constants; constant bytes %d -> %d", len(report.folded),
                len(report.lifted), report.constant_bytes_before, report.constant_bytes_after)
    return FoldResult(folded, report)


def _fold_once(working: Working, policy: FoldPolicy, bytes_before: int,
               timer: PhaseTimer) -> tuple[ExportedProgram, FoldReport]:
    """One fold of the top-level graph of `working.program`: the folded program and its report.
    An attempt that learns a new constraint is discarded and redone (timed as ``reruns``)."""
    budget = policy.growth_budget(bytes_before)
    program, gm = working.program, working.program.graph_module
    constraints = Constraints(writes={n: set(ws) for n, ws in unprobed_writes(gm.graph, in_body=False).items()})
    with timer.phase("bytes"):
        placeholder_bytes = placeholder_savings(gm.graph, program)
    while True:  # a fixpoint: each repeat adds a constraint (bound: `Constraints`)
        with timer.attempt() as attempt:
            with timer.phase("analysis"):
                analysis = analyze(gm.graph, program.graph_signature, policy, constraints.forced, constraints.writes)
            with timer.phase("planning"):
                plan = make_plan(analysis, policy, placeholder_bytes, bytes_before, constraints.budget_cut,
                                 working.transposes)
            with timer.phase("evaluation"):
                evaluation = evaluate(plan, analysis, gm, lambda n: stored_tensor(
                    analysis.specs[n.name], program.state_dict, program.constants))
            if evaluation.learnt is not None:
                logger.info("%s; folding again", evaluation.learnt)
                constraints.learn(evaluation.learnt)
                attempt.discard()
                continue
            if constraints.keep_failed(evaluation.kept):  # the plan must count what evaluation keeps
                logger.info("kept at fold time: %s; folding again", ", ".join(n.name for n in evaluation.kept))
                attempt.discard()
                continue
            with timer.phase("lift"):
                folded, kept_constant_only = folded_and_kept(plan, evaluation)
                nonfinite = NonfiniteScan()
                placement = place(program, folded, evaluation.values, analysis.is_constant, kept_constant_only, nonfinite)
                new_program, lifting = lift(program, placement, nonfinite, bound=evaluation.symbols)
            with timer.phase("bytes"):
                bytes_after = stored_constant_bytes(new_program)
            if not constraints.tighten_if_over_budget(budget, bytes_before, bytes_after):
                break
            logger.info("measured growth exceeds the budget; replanning with %d bytes less", constraints.budget_cut)
            attempt.discard()
    considered = [n for n in gm.graph.nodes if n.op == "call_function"]
    with timer.phase("report"):
        report = fold_report(considered, analysis, plan, evaluation, lifting, bytes_before, bytes_after)
    return new_program, report


@dataclass
class Constraints:
    """What one attempt teaches the next (`_fold_once`'s fixpoint): nodes the analysis must keep
    (`forced`: an op the plan folded had to stay), undeclared `writes`, bytes taken off the
    growth budget for planning (`budget_cut`, after `budget_misses` overruns). Each repeat adds
    a forced node, a write, or one of at most two cuts: at most 2N + 3 attempts for N nodes."""

    forced: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    writes: dict[torch.fx.Node, set[torch.fx.Node]] = field(default_factory=dict)
    budget_cut: int = 0
    budget_misses: int = 0

    def learn(self, write: UndeclaredWrite) -> None:
        self.writes.setdefault(write.node, set()).add(write.written)

    def keep_failed(self, kept: Mapping[torch.fx.Node, tuple[Reason, str]]) -> bool:
        """Keep at runtime, from the next attempt on, the nodes an evaluation kept for a reason
        of their own (`Evaluation.kept`). Returns whether one was new: the attempt must then be
        redone, since its plan's byte counts assumed them folded (docs/design.md, "Pipeline
        inside `fold_constants`")."""
        new = {n: why for n, why in kept.items() if why[0] is not Reason.DEPENDS_ON_KEPT and n not in self.forced}
        self.forced.update(new)
        return bool(new)

    def fits(self, budget: Optional[int], bytes_before: int, bytes_after: int) -> bool:
        """Whether `bytes_after` stored bytes are within `budget` (None: no limit) less
        ``budget_cut``; a plan with no budget left at all is final, so it fits."""
        if budget is None or budget - self.budget_cut < 0:
            return True
        return bytes_after - bytes_before - (budget - self.budget_cut) <= 0

    def tighten_if_over_budget(self, budget: Optional[int], bytes_before: int, bytes_after: int) -> bool:
        """When `fits` is false, raise ``budget_cut`` by the excess and return True (the
        attempt is redone)."""
        if self.fits(budget, bytes_before, bytes_after):
            return False
        excess = bytes_after - bytes_before - (budget - self.budget_cut)
        self.budget_misses += 1
        self.budget_cut = self.budget_cut + excess if self.budget_misses < 2 else budget + 1
        return True
