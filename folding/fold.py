"""`fold_constants`: the constant-propagation stage, the driver and the only module that imports
its steps: check → prepare → analyze → plan → evaluate → place → apply (lift) → measure → report,
then inline between rounds (prepare's `bodies` runs `analyze` on each body, as a
function the driver hands it; docs/design.md, "Pipeline inside `fold_constants`")."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram

from .analysis import analyze
from .checks import check_signature, check_stored_tensors, with_output_names
from .hops import unprobed_writes
from .inline import Inlining, inline_constant_conds
from .errors import FoldingError, FoldInternalError, InvalidProgramError, PolicyError
from .constraints import Constraints
from .evaluate import evaluate
from .dialect import dialect_op
from .lift import lift
from .nonfinite import NonfiniteScan
from .outcome import folded_and_kept, hoisted_and_kept
from .placement import place
from .plan import make_plan
from .policy import FoldPolicy
from .report import FoldReport, PhaseTimer, Reason
from .report_builder import body_decisions, fold_report, merged, with_rule_decisions
from .sizes import placeholder_savings, stored_constant_bytes, stored_tensor
from .torch_internals import replace_contents, reserve_names
from .working import Preparation, Working
from .work_counts import count

logger = logging.getLogger(__name__)


@dataclass
class FoldResult:
    """Attributes:
    program: the folded ExportedProgram (the input object itself only when ``inplace=True``).
    report: what was folded and kept, and why.
    """

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
            succeeded (`torch_internals.replace_contents`). The fold works on a copy either way,
            so on any error the caller's program is left unchanged (docs/design.md, invariant
            7). When False the caller's program (graph, signature, dicts, tensors) is left
            unchanged; unchanged tensors are shared, not copied.

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
        raise FoldInternalError(
            f"unexpected {type(e).__name__} while folding (a bug in the folding stage, please report it "
            f"with the program): {e}"
        ) from e
    result.report.repairs = [str(r) for r in repairs]
    if inplace:  # only a program that passed lift's checks replaces the caller's
        replace_contents(program, result.program)
        result = FoldResult(program, result.report)
    return result


def _fold(program: ExportedProgram, policy: FoldPolicy, timer: PhaseTimer) -> FoldResult:
    """Fold `program` in rounds: a round folds the top-level graph (`_fold_once`), control-flow
    bodies included (`bodies`: constant code moves out of its bodies and folds at the top
    level); a ``cond`` whose predicate became a stored constant is then inlined (`inline`) and
    the result folded again; a round that inlines nothing is the last."""
    with timer.phase("bytes"):
        bytes_before = stored_constant_bytes(program)
    with timer.phase("bodies"):
        clone_op = dialect_op(program, "aten.clone.default")
    pins: dict[str, tuple[Reason, str]] = {}
    steps: list[FoldReport | Inlining] = []  # folds, and the inlining between them
    reserved = {n.name for n in program.graph.nodes}  # the report's names (invariant 6)
    prepare = Preparation(program, policy, clone_op, pins, bytes_before, timer, analyze)
    while True:  # bound: each round removes a cond
        once = _fold_once(prepare, policy, bytes_before, timer, pins)
        folded = once.program
        steps.append(once.report)
        with timer.phase("inlining"):
            inlined = inline_constant_conds(folded, clone_op, reserved)
        if not inlined:
            break
        steps.append(inlined)
        prepare = prepare.after_inlining(folded, once.working, once.report.constant_bytes_after)
    reserve_names(folded.graph, reserved)  # invariant 6: a rewrite may have removed some of them
    with timer.phase("report"):
        report = merged(steps, folded)
        report.rewrites = list(once.working.notes)
        report.decisions.extend(body_decisions(folded, once.working.body_decisions))
        report.decisions = with_rule_decisions(report.decisions, once.working.fusions)
    report.timings = timer.timings()
    logger.info(
        "folded %d nodes into %d lifted constants; constant bytes %d -> %d",
        len(report.folded), len(report.lifted), report.constant_bytes_before, report.constant_bytes_after,
    )
    return FoldResult(folded, report)


@dataclass(frozen=True)
class _Round:
    """One fold of the top-level graph: the folded program, its report, and the working program
    it folded (`working.Working`)."""

    program: ExportedProgram
    report: FoldReport
    working: Working


def _fold_once(prepare: Preparation, policy: FoldPolicy, bytes_before: int, timer: PhaseTimer,
               pins: dict[str, tuple[Reason, str]]) -> _Round:
    """One fold of the top-level graph of the program `prepare` makes. `bytes_before`: the
    stored constant bytes of the caller's program (the growth budget's reference). An
    attempt that learns a new constraint (an in-place class kept whole, an undeclared write,
    a node moved out of a body but kept at runtime, which is then pinned in its body: `pins`,
    an op the plan folded but evaluation kept, a tighter budget) is discarded and redone; its
    time counts as ``reruns``."""
    budget = policy.growth_budget(bytes_before)
    constraints = Constraints()
    working = None
    # a fixpoint: each repeat adds a constraint or a pin (bound: `folding/constraints.py`)
    while True:
        with timer.attempt() as attempt:
            count("attempts")
            if working is None:  # the first attempt, or a node was pinned in its body
                working, placeholder_bytes = _prepared(prepare, constraints, timer)
                program, gm = working.program, working.program.graph_module
                assumed = unprobed_writes(gm.graph, in_body=False)  # once per working program
            with timer.phase("analysis"):
                analysis = analyze(gm.graph, program.graph_signature, policy, constraints.forced,
                                   _merged_writes(constraints.writes, assumed))
            with timer.phase("planning"):
                plan = make_plan(analysis, policy, placeholder_bytes, bytes_before, constraints.budget_cut,
                                 working.transposes)
            with timer.phase("evaluation"):
                evaluation = evaluate(plan, analysis, gm, _stored_value(program, analysis))
            if evaluation.learnt is not None:
                logger.info("%s; folding again", evaluation.learnt)
                constraints.learn(evaluation.learnt, analysis.alias_root)
                attempt.discard()
                continue
            considered = [n for n in gm.graph.nodes if n.op == "call_function"]
            kept = hoisted_and_kept(considered, analysis, plan, evaluation)
            # an op the plan folded that evaluation kept: the plan must count what it keeps
            redo = constraints.keep_failed(evaluation.kept)
            if kept.keys() - pins.keys():  # back into their bodies: the program to fold changes
                pins.update(kept)
                working = None
                redo = True
            if redo:
                logger.info("kept at fold time or pinned in a body: %s; folding again", ", ".join(sorted(kept) or [n.name for n in evaluation.kept]))
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
    with timer.phase("report"):
        report = fold_report(considered, analysis, plan, evaluation, lifting, bytes_before, bytes_after)
    return _Round(new_program, report, working)


def _prepared(prepare: Preparation, constraints: Constraints, timer: PhaseTimer) -> tuple[Working, dict]:
    """A new working program, the constraints rebound to its nodes, and what dropping each of
    its constant placeholders saves (`sizes.placeholder_savings`)."""
    working = prepare()
    constraints.rebound(working.program.graph)
    with timer.phase("bytes"):
        return working, placeholder_savings(working.program.graph, working.program)


def _merged_writes(learnt: dict, assumed: dict) -> dict:
    """The writes evaluation learnt and those the fold assumes (`hops.unprobed_writes`), per op."""
    if not assumed:
        return learnt
    out = {n: set(ws) for n, ws in learnt.items()}
    for n, ws in assumed.items():
        out.setdefault(n, set()).update(ws)
    return out


def _stored_value(program: ExportedProgram, analysis):
    """The stored tensor of a constant placeholder of `program` (read, never written)."""
    state_dict, constants = program.state_dict, program.constants
    return lambda n: stored_tensor(analysis.specs[n.name], state_dict, constants)
