"""Which constant values are folded, and which of them are stored as lifted constants.

A folded value is *materialised* (stored as a lifted constant) when a node that stays in the
program, or the graph output, reads it; every other folded value exists only during folding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from .analysis import Analysis


@dataclass
class Plan:
    """Attributes:
    folded: the call_function nodes to evaluate and remove, in graph order (assertion checks
        included).
    materialise: folded nodes whose value a kept node or the output reads.
    release: per folded node, the index in `folded` after which its value is no longer needed
        (its last folded reader, or the last in-place update of its alias class).
    """

    folded: list[torch.fx.Node]
    materialise: set[torch.fx.Node]
    release: dict[torch.fx.Node, int]


def make_plan(analysis: Analysis) -> Plan:
    """Fold every constant call_function node; materialise those read from outside the fold.

    O(nodes + edges).
    """
    folded = [n for n in analysis.order if n.op == "call_function" and analysis.reason.get(n) is None]
    position = {n: i for i, n in enumerate(folded)}
    materialise = {
        n for n in folded if not analysis.is_check(n) and any(u not in position for u in n.users)
    }
    last_update: dict[torch.fx.Node, int] = {}
    for root, muts in analysis.mutators.items():
        if root in position:
            last_update[root] = max(position[m] for m in muts)
    release: dict[torch.fx.Node, int] = {}
    for n in folded:
        last = position[n]
        for u in n.users:
            if u in position and position[u] > last:
                last = position[u]
        root = analysis.class_of(n)
        if root is not None and root in last_update:
            last = max(last, last_update[root])
        release[n] = last
    return Plan(folded, materialise, release)
