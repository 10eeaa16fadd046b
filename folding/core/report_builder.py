"""Builds the `FoldReport` from the records the stages return."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.fx
from torch.export import ExportedProgram

from ..control_flow.hops import body_paths
from ..lowering.control_flow_outputs import lowering_note
from .node_meta import report_names
from .ops import op_name
from .outcome import outcome
from .quant import describe_encoding
from ..reasons import Reason
from ..report import Decision, FoldReport

if TYPE_CHECKING:  # the record `inline` returns; a stage never imports another
    from ..control_flow.inline import Inlining


def fold_report(considered: list[torch.fx.Node], analysis, plan, evaluation, lifting, bytes_before: int,
                bytes_after: int) -> FoldReport:
    """The report of one fold of a graph, given its call_function nodes as analysed (nodes of
    the program `lift` read): one decision per node (`outcome.outcome`; a kept encoding is
    described as its copy in the folded program reads it), under each of its report names."""
    lifted_as = lifting.lifted_as
    decisions = []
    for n in considered:
        reason, detail = outcome(n, analysis, plan, evaluation)
        if reason is Reason.KEEPS_ENCODING:
            detail = describe_encoding(lifting.copies.get(n, n), lambda name: lifted_as.get(name, name))
        target, placeholder = op_name(n.target), lifted_as.get(n.name)
        decisions.extend(Decision(name, target, reason, detail, placeholder) for name in report_names(n, n.name))
    return FoldReport(decisions=decisions, lifted=lifting.lifted, removed_placeholders=lifting.removed,
                      constant_bytes_before=bytes_before, constant_bytes_after=bytes_after,
                      peak_intermediate_bytes=evaluation.peak_intermediate_bytes, evaluated_nodes=evaluation.evaluated)


def merged(steps: list[FoldReport | Inlining], program: ExportedProgram) -> FoldReport:
    """One report for successive folds of one program and the inlining of conds between them:
    a node's last decision wins; lifted constants are those the final program still has. Its
    notes say what lowering `program` needs (`executorch_workarounds.lowering_note`)."""
    notes = [note] if (note := lowering_note(program)) else []
    if len(steps) == 1:
        steps[0].notes = notes
        return steps[0]
    decisions: dict[str, Decision] = {}
    for step in steps:
        decisions.update((d.node, d) for d in step.decisions)
    # Code moved out of a branch that an inlined cond does not take is gone with that branch.
    untaken = tuple(prefix for step in steps if not isinstance(step, FoldReport) for prefix in step.untaken)
    for name, d in list(decisions.items()):
        if untaken and name.startswith(untaken) and d.reason is not Reason.BRANCH_NOT_TAKEN:
            decisions[name] = Decision(name, d.target, Reason.BRANCH_NOT_TAKEN)
    placeholders = {n.name for n in program.graph.nodes if n.op == "placeholder"}
    reports = [step for step in steps if isinstance(step, FoldReport)]
    lifted = {c.placeholder: c for r in reports for c in r.lifted if c.placeholder in placeholders}
    created = {c.placeholder for r in reports for c in r.lifted}
    removed = list(dict.fromkeys(p for r in reports for p in r.removed_placeholders if p not in created))
    return FoldReport(list(decisions.values()), list(lifted.values()), removed, reports[0].constant_bytes_before,
                      reports[-1].constant_bytes_after, notes=notes,
                      evaluated_nodes=sum(r.evaluated_nodes for r in reports),
                      peak_intermediate_bytes=max(r.peak_intermediate_bytes for r in reports))


def body_decisions(program: ExportedProgram, staying) -> list[Decision]:
    """The decisions of the nodes left in the bodies of `program` (the folded program), from
    the last hoisting (`bodies.Hoisting.decisions`), without those of bodies the fold removed
    with their HOP."""
    if not staying:
        return []
    kept = body_paths(program.graph_module)
    return [d for d in staying if d.node[: d.node.rindex("/") + 1] in kept]


def with_rule_decisions(decisions: list[Decision], rows) -> list[Decision]:
    """`decisions` with a prepare rewrite's rows (`weight_fusion.FusionRows`), each replacing
    the fold's decision for its node name or added; the fold's decisions for the nodes the
    rewrite inserted are dropped, unless one was kept although constant-only."""
    if not rows.decisions:
        return decisions
    replacing = {d.node: d for d in rows.decisions}
    out = [replacing.pop(d.node, d) for d in decisions
           if d.node not in rows.inserted or d.reason.constant_only]
    return out + list(replacing.values())
