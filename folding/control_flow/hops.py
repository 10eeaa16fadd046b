"""What each control-flow higher-order op (HOP) passes to its bodies: where its bodies are in
its arguments, which operand feeds each body placeholder, and which are the same at every
iteration (only those can be constant inside the body). From torch/_higher_order_ops:

- ``cond(pred, true_fn, false_fn, operands)``: both branches take ``operands``.
- ``while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)``: both take
  ``carried + additional``; the carry changes every iteration.
- ``map_impl(f, xs, pos_args)``: ``f`` takes one slice of each ``xs`` then ``pos_args``.
- ``scan(combine_fn, init, xs, additional_inputs)``: ``combine_fn`` takes the carry, one
  slice of each ``xs``, then ``additional_inputs``.
- ``wrap_with_set_grad_enabled(enabled, body, *args)`` and
  ``wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *args)``: the body
  takes ``args``, once.
"""

from __future__ import annotations

from dataclasses import dataclass
import operator
from typing import Callable, Optional

import torch
import torch.fx

from ..core.torch_internals import children_hidden, copy_attribute, copy_codegen, lazy_graph_module, set_uncompiled_graph
from ..core.names import copy_keeping_name, unique_name
from ..core.node_meta import body_path
from ..core.ops import OpKind, is_probed, op_facts

_hop = torch.ops.higher_order


@dataclass(frozen=True)
class HopKind:
    """Attributes:
    bodies: argument positions of the bodies (``get_attr`` nodes of GraphModules).
    varying: number of leading body placeholders fed by values that change per call of the
        body (loop carry, slices of the mapped/scanned inputs); never constant in the body.
    invariant_arg: argument position of the operand sequence passed unchanged to every call
        (the rest of the placeholders), or None when they are the trailing ``*args``.
    first_arg: for ``*args`` HOPs, the position where the operands start.
    wraps: code moved out of the body must run inside a region of the same HOP.
    """

    bodies: tuple[int, ...]
    varying: Callable[[torch.fx.Node], int]
    invariant_arg: Optional[int]
    first_arg: int = 0
    wraps: bool = False

    def invariant_operands(self, node: torch.fx.Node) -> list:
        return list(node.args[self.first_arg:] if self.invariant_arg is None else node.args[self.invariant_arg])

    def varying_operands(self, node: torch.fx.Node) -> list:
        """The operands that change per call of the body (a loop's carry, the mapped inputs)."""
        end = max(self.bodies) + 1 if self.invariant_arg is None else self.invariant_arg
        return [a for seq in node.args[max(self.bodies) + 1: end] for a in seq]

    def with_operands(self, node: torch.fx.Node, operands: list) -> tuple:
        """`node`'s arguments with `operands` as its invariant operands."""
        args = list(node.args)
        if self.invariant_arg is None:
            return tuple(args[: self.first_arg] + list(operands))
        old = args[self.invariant_arg]
        args[self.invariant_arg] = list(operands) if isinstance(old, list) else tuple(operands)
        return tuple(args)


HOPS: dict[object, HopKind] = {
    _hop.cond: HopKind(bodies=(1, 2), varying=lambda n: 0, invariant_arg=3),
    _hop.while_loop: HopKind(bodies=(0, 1), varying=lambda n: len(n.args[2]), invariant_arg=3),
    _hop.map_impl: HopKind(bodies=(0,), varying=lambda n: len(n.args[1]), invariant_arg=2),
    _hop.scan: HopKind(bodies=(0,), varying=lambda n: len(n.args[1]) + len(n.args[2]), invariant_arg=3),
    _hop.wrap_with_set_grad_enabled: HopKind(bodies=(1,), varying=lambda n: 0, invariant_arg=None, first_arg=2),
    _hop.wrap_with_autocast: HopKind(bodies=(4,), varying=lambda n: 0, invariant_arg=None, first_arg=5, wraps=True),
}


def hop_kind(node: torch.fx.Node) -> Optional[HopKind]:
    """The `HopKind` of a call_function node, or None when it is not a HOP with plain bodies."""
    return HOPS.get(node.target) if node.op == "call_function" else None


def hop_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The nodes of `graph` that call a HOP of `HOPS`, in graph order."""
    return sorted(n for target in HOPS for n in graph.find_nodes(op="call_function", target=target, sort=False))


def unprobed_writes(graph: torch.fx.Graph, in_body: bool) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """The writes the fold assumes because it cannot probe them (only the top level's custom
    ops are probed, `plan.Plan.probed`): in a body (`in_body`), a custom op writes every tensor
    it reads; a HOP whose bodies call one writes every operand it passes."""
    out: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    if in_body:
        out.update((n, list(n.all_input_nodes)) for n in graph.nodes if n.op == "call_function" and is_probed(n))
    for hop in hop_nodes(graph):
        if any(_calls_custom_op(body) for _, body in bodies(hop)):
            out[hop] = [i for i in hop.all_input_nodes if i.op != "get_attr"]
    return out


def _calls_custom_op(body: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and is_probed(n) for n in body.graph.nodes) or any(
        _calls_custom_op(inner) for hop in hop_nodes(body.graph) for _, inner in bodies(hop))


def bodies(node: torch.fx.Node) -> list[tuple[str, torch.fx.GraphModule]]:
    """(attribute name, GraphModule) of each body of a HOP node, in argument order."""
    kind = hop_kind(node)
    owner = node.graph.owning_module
    out = []
    for position in kind.bodies if kind else ():
        attr = node.args[position]
        if isinstance(attr, torch.fx.Node) and attr.op == "get_attr":
            module = getattr(owner, attr.target, None)
            if isinstance(module, torch.fx.GraphModule):
                out.append((attr.target, module))
    return out


def evaluable(node: torch.fx.Node) -> bool:
    """True for a HOP of `HOPS` whose bodies (nested too) call no random, effectful or
    memory-planning op: with every operand constant, it is evaluated whole by calling it."""
    for n in (n for _, body in bodies(node) for n in body.graph.nodes if n.op == "call_function"):
        k = op_facts(n.target).kind
        if k in (OpKind.RANDOM, OpKind.EFFECTFUL, OpKind.MEMORY) or k is OpKind.CONTROL_FLOW and not evaluable(n):
            return False
    return hop_kind(node) is not None


def graph_module(attributes_from: object, graph: torch.fx.Graph, class_name: str) -> torch.fx.GraphModule:
    """``torch.fx.GraphModule(attributes_from, graph)`` (a module, or a dict from ``get_attr``
    target to value) that compiles `graph` only, on first use. The constructor would also
    recompile every GraphModule child; here the bodies are attached afterwards, as they are."""
    attributes: dict[str, object] = {}
    later: dict[str, torch.fx.GraphModule] = {}
    for n in graph.nodes:
        if n.op != "get_attr" or n.target in attributes:
            continue
        value = attributes_from[n.target] if isinstance(attributes_from, dict) else operator.attrgetter(n.target)(attributes_from)
        if isinstance(value, torch.fx.GraphModule):
            later[n.target], value = value, torch.nn.Module()
        attributes[n.target] = value
    out = lazy_graph_module(attributes, graph, class_name)
    for target, body in later.items():
        owner, _, name = target.rpartition(".")
        setattr(out.get_submodule(owner) if owner else out, name, body)
    return out


def recompile_shallow(gm: torch.fx.GraphModule) -> None:
    """``gm.recompile()`` without recompiling its GraphModule children (see `graph_module`); on
    a `graph_module` it only marks the code stale."""
    with children_hidden(gm):
        gm.recompile()


def drop_unused_attributes(gm: torch.fx.GraphModule) -> None:
    """Delete `gm`'s submodules and tensor attributes that no ``get_attr`` of its graph reads.
    Only for modules the stage owns (a copy it made or built)."""
    read = {n.target.split(".")[0] for n in gm.graph.find_nodes(op="get_attr")}
    names = [n for n, _ in gm.named_children()] + [n for n, _ in gm.named_parameters(recurse=False, remove_duplicate=False)]
    names += [n for n, _ in gm.named_buffers(recurse=False, remove_duplicate=False)]
    names += [k for k, v in vars(gm).items() if isinstance(v, torch.Tensor)]
    for name in names:
        if name not in read:
            delattr(gm, name)


def move_attribute(gm: torch.fx.GraphModule, body: torch.fx.GraphModule, target: str,
                   graph: Optional[torch.fx.Graph] = None) -> torch.fx.Node:
    """Make `body`'s attribute `target` an attribute of `gm`, under a free name, and return a
    ``get_attr`` of it in `graph` (``create_node``: ``Graph.get_attr`` warns about a tensor)."""
    name = free_attribute(gm, target)
    setattr(gm, name, operator.attrgetter(target)(body))
    return (gm.graph if graph is None else graph).create_node("get_attr", name)


def free_attribute(gm: torch.fx.GraphModule, target: str) -> str:
    """An attribute name of `gm` not in use, derived from `target` (dots become ``_``)."""
    return unique_name(target.replace(".", "_"), set(dir(gm)))


def copy_uncompiled(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, torch.fx.Node]]:
    """A copy of `gm`'s graph (names and metadata kept; ``meta`` values and attributes shared)
    in a new GraphModule compiled on first use, and the node map."""
    graph = torch.fx.Graph()
    copy_codegen(gm.graph, graph)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in gm.graph.nodes:  # names are unique in `gm`: each copy gets its own back
        env[n] = copy_keeping_name(graph, n, env.__getitem__)
    out = lazy_graph_module(torch.nn.Module(), torch.fx.Graph(), gm.__class__.__name__)
    for target in dict.fromkeys(n.target for n in graph.nodes if n.op == "get_attr"):
        copy_attribute(gm, out, target)
    set_uncompiled_graph(out, graph)  # GraphModule.graph's setter would compile it now
    out.meta.update(gm.meta)
    return out, env


def body_paths(gm: torch.fx.GraphModule, prefix: str = "") -> set[str]:
    """The report paths (`node_meta.body_path`) of every body called from `gm`, nested too."""
    out: set[str] = set()
    for hop in hop_nodes(gm.graph):
        for attr, body in bodies(hop):
            path = body_path(prefix, hop, attr)
            out.add(path)
            out |= body_paths(body, path)
    return out
