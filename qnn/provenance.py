"""Where an Edge node comes from: the ATen node it derives from (``meta["from_node"]``), and
provenance keys that identify an Edge node across two lowerings of related programs
(`qnn.names` matches the folded and the unfolded program's Edge nodes with them)."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import torch

from folding.core.ops import op_name

Key = Tuple  # (ATen origin node name, op name, rank among that origin's nodes of that op), see node_keys


def origin(node: torch.fx.Node, graph_id: int) -> Optional[str]:
    """Name of the node of the graph with ``id(graph) == graph_id`` that `node` was derived
    from, following ``node.meta["from_node"]`` breadth first; None when there is none."""
    frontier = list(node.meta.get("from_node") or ())
    while frontier:
        nxt = []
        for source in frontier:
            if source.graph_id == graph_id:
                return source.name
            nxt.extend(source.from_node or ())
        frontier = nxt
    return None


def node_keys(graph: torch.fx.Graph, graph_id: int) -> Dict[torch.fx.Node, List[Key]]:
    """Provenance keys of the call_function nodes of `graph`, most specific first.

    A node with an ATen origin in `graph_id` has one key: (origin, op, rank among that origin's
    nodes of that op). A node a pass created without provenance (QNN's ``I64toI32`` inserts
    ``_to_copy`` nodes) is keyed through its neighbours: one key per keyed user (that user's key,
    the argument position, op), then, if it has no keyed user, one per keyed input.
    """
    rank: Dict[Tuple, int] = defaultdict(int)
    keys: Dict[torch.fx.Node, List[Key]] = {}
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    for n in nodes:
        src = origin(n, graph_id)
        if src is not None:
            op = op_name(n.target)
            keys[n] = [(src, op, rank[(src, op)])]
            rank[(src, op)] += 1
    for n in reversed(nodes):  # users before producers: chains of unkeyed nodes resolve
        if n in keys:
            continue
        derived = [
            (("user",) + keys[u][0], op_name(n.target), u.all_input_nodes.index(n))
            for u in n.users if u in keys
        ]
        if derived:
            keys[n] = derived
    for n in nodes:
        if n in keys:
            continue
        op = op_name(n.target)
        derived = []
        for i in n.all_input_nodes:
            if i in keys:
                anchor = ("input",) + keys[i][0]
                derived.append((anchor, op, rank[(anchor, op)]))
                rank[(anchor, op)] += 1
        if derived:
            keys[n] = derived
    return keys
