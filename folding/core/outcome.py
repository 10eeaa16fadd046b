"""What became of one node in one attempt: folded, checked, or kept at runtime, and why
(the analysis, the plan and the evaluation may keep it: the latest stage knows best why)."""

from __future__ import annotations

import torch.fx

from ..reasons import Reason


def outcome(node: torch.fx.Node, analysis, plan, evaluation) -> tuple[Reason, str]:
    """The `Reason` and detail of `node` (a call_function node of the analysed graph):
    `Reason.FOLDED` or `Reason.CHECKED` when it leaves the program, else why it stays."""
    if node in evaluation.kept:
        return evaluation.kept[node]
    if node in plan.runtime:
        return plan.runtime[node]
    reason = analysis.reason[node]
    if reason is None:
        return (Reason.CHECKED if analysis.is_check(node) else Reason.FOLDED), ""
    return reason, analysis.detail.get(node, "")


def folded_and_kept(plan, evaluation) -> tuple[set[torch.fx.Node], frozenset]:
    """The plan's folded nodes that evaluation did not keep, and every constant-only node kept
    at runtime by the plan or the evaluation."""
    folded = {n for n in plan.candidates if plan.folded(n) and n not in evaluation.kept}
    return folded, frozenset(plan.runtime) | frozenset(evaluation.kept)
