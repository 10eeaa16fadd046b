"""Replace a ``cond`` whose predicate is a stored constant (after a fold, a lifted constant or
a literal) by the branch it takes, copied into the calling graph; a following fold then folds
across the inlined code."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch
import torch.fx
from torch.export import ExportedProgram

from .hops import bodies, drop_unused_attributes, move_attribute, recompile_shallow
from ..core.ops import op_name
from ..core.names import keep_name, reserve_node_names, unique_name
from ..core.node_meta import REPORT_NAME, mark_inlined
from ..reasons import Reason
from ..report import Decision
from ..core.sizes import stored_tensor
from ..core.unchanging import unchanging_before_probes


@dataclass
class Inlining:
    """What `inline_constant_conds` did, by report name: `decisions` (`Reason.INLINED` per
    inlined cond and per getitem removed, `Reason.BRANCH_NOT_TAKEN` per op of a branch not
    taken) and `untaken`, the body path (``cond.false_graph_0/``) of each branch not taken."""

    decisions: list[Decision] = field(default_factory=list)
    untaken: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.untaken)


def inline_constant_conds(program: ExportedProgram, clone_op, reserved: Iterable[str] = ()) -> Inlining:
    """Inline, in `program`'s top-level graph (changed in place), every ``cond`` whose predicate
    is a literal or a parameter, buffer or lifted constant whose value is the same at every
    call (`unchanging.unchanging_before_probes`). `clone_op`: the dialect's copy op, for a graph
    output the branch returns unchanged from its operands; `reserved`: names an inlined node
    must not take (invariant 6). Returns the `Inlining`, false when no cond was inlined."""
    gm = program.graph_module
    specs = functools.cache(lambda: unchanging_before_probes(program))  # a walk, only when needed

    def constant_value(pred) -> Optional[bool]:
        if isinstance(pred, (bool, int)):
            return bool(pred)
        if not (isinstance(pred, torch.fx.Node) and pred.op == "placeholder"):
            return None
        spec = specs().get(pred.name)
        value = None if spec is None else stored_tensor(spec, program.state_dict, program.constants)
        return bool(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else None

    reserve_node_names(gm)
    inlining = Inlining()
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.higher_order.cond):  # a list, in order
        taken = constant_value(node.args[0])
        if taken is None:
            continue
        branches = bodies(node)
        name = node.meta.get(REPORT_NAME, node.name)
        inlining.decisions.append(Decision(name, op_name(node.target), Reason.INLINED, f"predicate {node.args[0]} is {taken}"))
        attr, untaken = branches[1 if taken else 0]
        inlining.untaken.append(f"{name}.{attr}/")
        inlining.decisions.extend(Decision(f"{name}.{attr}/{n.name}", op_name(n.target), Reason.BRANCH_NOT_TAKEN)
                                  for n in untaken.graph.nodes if n.op == "call_function")
        inlining.decisions.extend(Decision(removed, "_operator.getitem", Reason.INLINED, f"read {name}'s result")
                                  for removed in _inline(gm, node, branches[0 if taken else 1], clone_op, name, reserved))
    if inlining:
        _erase_unused_get_attrs(gm.graph)
        drop_unused_attributes(gm)
        recompile_shallow(gm)
    return inlining


def _inline(gm, cond: torch.fx.Node, branch: tuple[str, torch.fx.GraphModule], clone_op, name: str,
            reserved: Iterable[str]) -> list[str]:
    """Copy `branch` into `gm` before `cond` and make the cond's getitems read its results;
    `name`: the cond's report name. Returns the names of the getitems removed."""
    attr, body = branch
    path = f"{name}.{attr}/"
    graph = gm.graph
    names = {n.name for n in graph.nodes} | set(reserved)
    operands = list(cond.args[3])
    env: dict[torch.fx.Node, object] = {}
    computed: set[torch.fx.Node] = set()
    with graph.inserting_before(cond):
        for n in body.graph.nodes:
            if n.op == "placeholder":
                env[n] = operands[len([p for p in env if p.op == "placeholder"])]
            elif n.op == "output":
                results = torch.fx.map_arg(n.args[0], env.__getitem__)
            elif n.op == "get_attr":
                env[n] = move_attribute(gm, body, n.target, graph)
            else:
                copied = graph.node_copy(n, env.__getitem__)
                keep_name(copied, unique_name(n.name, names))
                names.add(copied.name)
                mark_inlined(copied, path + n.name)
                env[n] = copied
                computed.add(copied)
    renamed: set[torch.fx.Node] = set()
    removed: list[str] = []
    for user in list(cond.users):
        if user.target is not operator.getitem:
            continue
        value = results[user.args[1]]
        if value in computed and value not in renamed:
            # The inlined node takes the getitem's name (an output spec may name it).
            user.replace_all_uses_with(value)
            graph.erase_node(user)
            keep_name(value, user.name)
            renamed.add(value)
        elif not any(u.op == "output" for u in user.users):
            user.replace_all_uses_with(value)
            graph.erase_node(user)
            removed.append(user.name)
        else:  # an operand (or a value already returned): a copy of it takes the name
            with graph.inserting_before(user):
                copied = graph.call_function(clone_op, (value,))
            copied.meta = dict(user.meta)
            user.replace_all_uses_with(copied)
            graph.erase_node(user)
            keep_name(copied, user.name)
    graph.erase_node(cond)
    return removed


def _erase_unused_get_attrs(graph: torch.fx.Graph) -> None:
    """Only the get_attrs of the inlined bodies go (invariant 6). Not ``eliminate_dead_code``: it
    also edits every GraphModule child a get_attr reads, maybe the caller's (invariant 7)."""
    for node in graph.find_nodes(op="get_attr"):
        if not node.users:
            graph.erase_node(node)

