"""What became of one node in one attempt: folded, checked, or kept at runtime, and why.

Three records can keep a constant node at runtime: the analysis (`Analysis.reason`: it reads a
runtime input, a mutated buffer, …, or a constraint forced it), the plan (`Plan.runtime`: a
size limit, a kept encoding) and the evaluation (`Evaluation.kept`: the op raised, or its
value cannot be stored). `outcome` is the one place their verdicts are merged, in that order
of precedence (the latest stage that kept a node knows best why); the report reads it, and
`folded_and_kept` says what `placement` and `lift` remove and keep.
"""

from __future__ import annotations

import torch.fx

from .reasons import Reason


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
    """The plan's folded nodes that evaluation did not keep (what `lift` removes), and every
    constant-only node kept at runtime by the plan or the evaluation."""
    folded = {n for n in plan.candidates if plan.folded(n) and n not in evaluation.kept}
    return folded, frozenset(plan.runtime) | frozenset(evaluation.kept)
