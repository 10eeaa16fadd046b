"""Builds the `FoldReport`: the one place decisions and lifted-constant rows are made, from
the records the stages return (`Analysis`, `Plan`, `Evaluation`, `Lifting`, `Inlining`) and,
for nodes left in control-flow bodies, from an analysis of each body."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.fx
from torch.export import ExportedProgram

from .analysis import analyze
from .bodies import body_path, body_signature, constant_placeholders, has_bodies
from .hops import bodies, hop_kind
from .inline import Inlining
from .lowering import lowering_note
from .node_meta import pin_names, report_names
from .ops import op_name
from .policy import FoldPolicy
from .quant import describe_encoding
from .reasons import Reason
from .report import Decision, FoldReport, LiftedConstant
from .sizes import nbytes


def fold_report(considered: list[torch.fx.Node], analysis, plan, evaluation, lifting, bytes_before: int,
                bytes_after: int) -> tuple[FoldReport, dict[str, tuple[Reason, str]]]:
    """The report of one fold of a graph, given its call_function nodes as analysed (`lift`
    may have erased the folded ones since), and the nodes moved out of bodies that it kept at
    runtime, by body path (`_fold_decisions`)."""
    decisions, moved_kept = _fold_decisions(considered, analysis, plan, evaluation, lifting)
    report = FoldReport(
        decisions=decisions,
        lifted=lifting.lifted,
        removed_placeholders=lifting.removed,
        constant_bytes_before=bytes_before,
        constant_bytes_after=bytes_after,
        peak_intermediate_bytes=evaluation.peak_intermediate_bytes,
        evaluated_nodes=evaluation.evaluated,
    )
    return report, moved_kept


def inlining_decisions(inlining: Inlining) -> list[Decision]:
    """A decision for each inlined cond and each getitem an inlined node replaced
    (`Reason.INLINED`), and for each op of the branches not taken (`Reason.BRANCH_NOT_TAKEN`)."""
    out = [Decision(name, op_name(torch.ops.higher_order.cond), Reason.INLINED, f"predicate {pred} is {taken}")
           for name, pred, taken in inlining.conds]
    out += [Decision(name, target, Reason.BRANCH_NOT_TAKEN) for name, target in inlining.untaken_ops]
    out += [Decision(name, "_operator.getitem", Reason.INLINED, f"read {cond}'s result") for name, cond in inlining.replaced]
    return out


def _fold_decisions(considered: list[torch.fx.Node], analysis, plan, evaluation, lifting
                    ) -> tuple[list[Decision], dict[str, tuple[Reason, str]]]:
    """One decision per call_function node of `considered`, under its report names (a node
    moved out of a body is reported under its body path); and, by body path, the moved nodes
    the fold kept at runtime, with why (they are pinned in their bodies for the next fold)."""
    decisions = _decisions(considered, analysis, plan, evaluation, lambda name: lifting.lifted_as.get(name, name))
    out, moved_kept = [], {}
    for n, d in zip(considered, decisions):
        for name in report_names(n, d.node):
            out.append(Decision(name, d.target, d.reason, d.detail, lifting.lifted_as.get(d.node)))
        if not d.folded:
            moved_kept.update((name, (d.reason, d.detail)) for name in pin_names(n))
    return out, moved_kept


def _decisions(nodes, analysis, plan, evaluation, rename) -> list[Decision]:
    """One decision per node of `nodes` (call_function nodes of the folded graph), from the
    attempt's records: kept by evaluation, kept by the plan, or the analysis' reason."""
    out = []
    for n in nodes:
        reason = analysis.reason[n]
        detail = analysis.detail.get(n, "")
        if n in evaluation.kept:
            reason, detail = evaluation.kept[n]
        elif n in plan.runtime:
            reason, detail = plan.runtime[n]
            if reason is Reason.KEEPS_ENCODING:
                detail = describe_encoding(n, rename)
        elif reason is None:
            reason = Reason.CHECKED if analysis.is_check(n) else Reason.FOLDED
        out.append(Decision(n.name, op_name(n.target), reason, detail))
    return out


def merged(steps: list[FoldReport | Inlining], program: ExportedProgram) -> FoldReport:
    """One report for successive folds of one program and the inlining of conds between them:
    a node's last decision wins; lifted constants are those the final program still has.
    Timings are the driver's (`PhaseTimer`). Its notes say what lowering `program` (the folded
    program) needs (`lowering.lowering_note`: the config for its control flow)."""
    notes = [note] if (note := lowering_note(program)) else []
    if len(steps) == 1:
        steps[0].notes = notes
        return steps[0]
    decisions: dict[str, Decision] = {}
    for step in steps:
        step_decisions = step.decisions if isinstance(step, FoldReport) else inlining_decisions(step)
        decisions.update((d.node, d) for d in step_decisions)
    # Code moved out of a branch that an inlined cond does not take is gone with that branch.
    untaken = tuple(prefix for step in steps if isinstance(step, Inlining) for prefix in step.untaken)
    for name, d in list(decisions.items()):
        if untaken and name.startswith(untaken) and d.reason is not Reason.BRANCH_NOT_TAKEN:
            decisions[name] = Decision(name, d.target, Reason.BRANCH_NOT_TAKEN)
    placeholders = {n.name for n in program.graph.nodes if n.op == "placeholder"}
    reports = [step for step in steps if isinstance(step, FoldReport)]
    lifted = {c.placeholder: c for r in reports for c in r.lifted if c.placeholder in placeholders}
    created = {c.placeholder for r in reports for c in r.lifted}
    return FoldReport(
        decisions=list(decisions.values()),
        lifted=list(lifted.values()),
        removed_placeholders=list(dict.fromkeys(p for r in reports for p in r.removed_placeholders if p not in created)),
        constant_bytes_before=reports[0].constant_bytes_before,
        constant_bytes_after=reports[-1].constant_bytes_after,
        peak_intermediate_bytes=max(r.peak_intermediate_bytes for r in reports),
        evaluated_nodes=sum(r.evaluated_nodes for r in reports),
        notes=notes,
    )


def body_decisions(program: ExportedProgram, policy: FoldPolicy, pins: Mapping[str, tuple]) -> list:
    """A `Decision` for every call_function node left in a body of `program` (the folded
    program), named by its body path (``cond.true_graph_0/matmul``): a node reading a runtime
    operand, the loop carry or a mapped slice has that reason; a constant node stayed because
    the fold would have kept it at runtime (`pins`: the reason it was pinned), or it is a
    check, which runs where its body runs."""
    if not has_bodies(program.graph_module):
        return []  # nothing to name, and no second analysis of the top-level graph
    top = analyze(program.graph, program.graph_signature, policy)
    out: list = []

    def visit(gm, is_constant, prefix):
        for hop in gm.graph.nodes:
            if hop_kind(hop) is None:
                continue
            for attr, body in bodies(hop):
                path = body_path(prefix, hop, attr)
                sources = constant_placeholders(hop, body, is_constant)
                placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
                analysis = analyze(body.graph, body_signature(placeholders, set(sources)), policy)
                for n in body.graph.nodes:
                    if n.op != "call_function":
                        continue
                    for name in report_names(n, path + n.name):  # none for glue
                        reason, detail = analysis.reason[n], analysis.detail.get(n, "")
                        if reason is None:
                            reason, detail = pins.get(name) or (Reason.CONTROL_FLOW,
                                                                "a check on constants runs where its body runs")
                        elif reason is Reason.RUNTIME_INPUT:
                            detail = "reads a runtime operand, the loop carry or a mapped slice"
                        out.append(Decision(name, op_name(n.target), reason, detail))
                visit(body, analysis.is_constant, path)

    visit(program.graph_module, top.is_constant, "")
    return out



def lifted_row(placeholder: str, target: str, replaces, t: torch.Tensor, *, reused: bool, nonfinite: bool,
               moved: bool = False) -> LiftedConstant:
    """The report's row for one lifted (or reused) constant placeholder holding `t`."""
    return LiftedConstant(
        placeholder=placeholder, target=target, replaces=tuple(replaces), shape=tuple(t.shape),
        dtype=str(t.dtype).replace("torch.", ""), nbytes=nbytes(t), reused=reused, nonfinite=nonfinite,
        moved=moved,
    )
