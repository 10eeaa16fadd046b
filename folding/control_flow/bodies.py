"""Constant code inside control-flow bodies (code reading only operands that are the same
constant at every call) moved to the calling graph, innermost bodies first, so the top-level
fold folds it; what the fold keeps at runtime is put back (`sink_kept_code`), so an op that
raises in a branch not taken never runs. Nothing is merged: a write may reach either of two
equal nodes."""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from ..core.torch_internals import program_with
from .hops import (bodies, copy_uncompiled, drop_unused_attributes, free_attribute, graph_module, hop_kind, hop_nodes,
                   move_attribute, recompile_shallow, unprobed_writes)
from ..core.names import copy_keeping_name, reserve_node_names
from ..core.node_meta import HOISTED_FROM, body_path, mark_glue, mark_hoisted, report_names
from ..core.ops import OpKind, op_name
from ..policy import FoldPolicy
from ..reasons import Reason
from ..report import Decision


@dataclass(frozen=True)
class Hoisting:
    """What `hoist_body_constants` made: the program, the GraphModules it made (the stages
    after it may edit them in place), why each call_function node left in a body stays."""

    program: ExportedProgram
    owned: frozenset
    decisions: tuple[Decision, ...] = ()


def hoist_body_constants(program: ExportedProgram, policy: FoldPolicy, clone_op, *, analyze,
                         inplace: bool = False) -> Hoisting:
    """`program` with the constant code of every body moved to its caller: a copy (tensors,
    signature and dicts shared), or `program` itself when it calls no control flow. `clone_op`:
    the dialect's copy op; `analyze`: `analysis.analyze` (a stage never imports another);
    `inplace`: `program`'s top-level graph module is the caller's own copy: edit it."""
    if not hop_nodes(program.graph):
        return Hoisting(program, frozenset())
    gm = program.graph_module if inplace else copy_uncompiled(program.graph_module)[0]
    reserve_node_names(gm)
    hoist = _Hoist(policy, clone_op, analyze, gm)
    hoist.own_bodies(gm)  # before the analysis: it may add get_attr nodes to `gm`
    top = analyze(gm.graph, program.graph_signature, policy, extra_writes=unprobed_writes(gm.graph, in_body=False))
    hoist.graph(gm, top.is_constant, "")
    for module in hoist.owned:
        drop_unused_attributes(module)
        recompile_shallow(module)
    result = program if inplace else program_with(program, graph_module=gm)
    return Hoisting(result, frozenset(hoist.owned), tuple(hoist.decisions))


def body_signature(placeholders: list[torch.fx.Node], constant: set[torch.fx.Node]) -> ExportGraphSignature:
    """A signature under which `analyze` treats a body's `constant` placeholders as stored
    constants and the others as runtime inputs."""
    specs = [InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(p.name), p.name) if p in constant
             else InputSpec(InputKind.USER_INPUT, TensorArgument(p.name), None) for p in placeholders]
    return ExportGraphSignature(input_specs=specs, output_specs=[])


def _constant_placeholders(hop: torch.fx.Node, body: torch.fx.GraphModule, is_constant) -> dict:
    """Body placeholder -> the caller's operand, for the placeholders fed by the same constant
    at every call of the body."""
    kind = hop_kind(hop)
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"][kind.varying(hop):]
    return {p: o for p, o in zip(placeholders, kind.invariant_operands(hop))
            if isinstance(o, torch.fx.Node) and is_constant(o)}


def _analyze_body(body: torch.fx.GraphModule, sources, policy: FoldPolicy, analyze):
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    return analyze(body.graph, body_signature(placeholders, set(sources)), policy,
                   extra_writes=unprobed_writes(body.graph, in_body=True))


def _is_body(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    return node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.nn.Module)


def split_body(body: torch.fx.GraphModule, sources: dict, policy: FoldPolicy, path: str, analyze):
    """The nodes of `body` that move out, in graph order: the constant call_function nodes
    whose inputs are constant operands (`sources`), nodes moved before them or nested bodies;
    checks and what reads them stay; tensor attributes always move. Returns (moved nodes, those
    of them something left in the body reads, the decisions of the call_function nodes that
    stay). `body` is only read."""
    analysis = _analyze_body(body, sources, policy, analyze)
    hoisted: set[torch.fx.Node] = set()
    for n in body.graph.nodes:
        if (n.op == "call_function" and analysis.is_constant(n) and analysis.kind.get(n) is not OpKind.ASSERTION
                and all(i in hoisted or i in sources or _is_body(body, i) for i in n.all_input_nodes)):
            hoisted.add(n)
    moved = {n: None for n in body.graph.nodes if n in hoisted or n.op == "get_attr" and (
        all(u in hoisted for u in n.users) if _is_body(body, n) else analysis.is_constant(n))}
    sinks = [n for n in moved if any(u not in moved for u in n.users)]
    decisions = []
    for n in body.graph.nodes:
        if n.op != "call_function" or n in moved:
            continue
        reason, detail = analysis.reason[n], analysis.detail.get(n, "")
        if reason is None:
            reason, detail = Reason.CONTROL_FLOW, "a check on constants runs where its body runs"
        elif reason is Reason.RUNTIME_INPUT:
            detail = "reads a runtime operand, the loop carry or a mapped slice"
        decisions.extend(Decision(name, op_name(n.target), reason, detail) for name in report_names(n, path + n.name))
    return moved, sinks, decisions


class _Hoist:
    """Rewrites what `split_body` decided, on copies of the bodies: the moved nodes go before
    the HOP (into a new region for autocast; folding computes no gradients, so ``no_grad``
    needs none) and the body reads them as new operands."""

    def __init__(self, policy: FoldPolicy, clone_op, analyze, top: torch.fx.GraphModule) -> None:
        self.policy, self.clone_op, self.analyze = policy, clone_op, analyze
        self.decisions: list[Decision] = []  # of the nodes left in the bodies
        self.owned: dict[torch.fx.GraphModule, None] = {top: None}  # each recompiled once at the end

    def own_bodies(self, gm: torch.fx.GraphModule) -> None:
        """Give every body slot of `gm`'s HOPs, nested ones included, a copy of its body under
        an attribute of its own: the caller's bodies are never edited (invariant 7), and a body
        two slots call is rewritten for each call separately."""
        taken: set[str] = set()
        for hop in hop_nodes(gm.graph):
            args = list(hop.args)
            for position in hop_kind(hop).bodies:
                a = args[position]
                body, _ = copy_uncompiled(getattr(gm, a.target))
                self.owned[body] = None
                if a.target in taken:
                    with gm.graph.inserting_before(hop):
                        args[position] = gm.graph.create_node("get_attr", free_attribute(gm, a.target))
                    args[position].meta = copy.copy(a.meta)
                taken.add(args[position].target)
                setattr(gm, args[position].target, body)
                self.own_bodies(body)
            hop.args = tuple(args)

    def graph(self, gm: torch.fx.GraphModule, is_constant, prefix: str) -> None:
        for hop in hop_nodes(gm.graph):
            self.hop(gm, hop, is_constant, prefix)

    def hop(self, gm, hop, is_constant, prefix) -> None:
        kind = hop_kind(hop)
        moved, value_of = [], {}  # value_of: sink -> the caller's node for it
        for attr, body in bodies(hop):
            path = body_path(prefix, hop, attr)
            sources = _constant_placeholders(hop, body, is_constant)
            if hop_nodes(body.graph):  # nested control flow: its bodies are edited first
                self.graph(body, _analyze_body(body, sources, self.policy, self.analyze).is_constant, path)
            hoisted, sinks, decisions = split_body(body, sources, self.policy, path, self.analyze)
            self.decisions.extend(decisions)
            if hoisted:
                with gm.graph.inserting_before(hop):
                    move = _wrap_hoisted if kind.wraps else _copy_hoisted
                    value_of.update(zip(sinks, move(gm, hop, body, hoisted, sinks, sources, path)))
            moved.append((body, hoisted, sinks))
        if not value_of:
            return
        new_operands = list(value_of.values())
        for body, hoisted, sinks in moved:
            _replace_with_operands(body, hoisted, sinks, new_operands, value_of, self.clone_op)
        hop.args = kind.with_operands(hop, kind.invariant_operands(hop) + new_operands)
        _drop_unused_operands(hop)


def _copy_hoisted(gm, hop, body, hoisted, sinks, sources, path) -> list[torch.fx.Node]:
    env: dict[torch.fx.Node, torch.fx.Node] = dict(sources)
    for n in hoisted:
        if n.op == "get_attr":
            env[n] = move_attribute(gm, body, n.target)
            env[n].meta = copy.copy(n.meta)
        else:
            env[n] = gm.graph.node_copy(n, env.__getitem__)
        mark_hoisted(env[n], path + n.name)
    return [env[s] for s in sinks]


def _wrap_hoisted(gm, hop, body, hoisted, sinks, sources, path) -> list[torch.fx.Node]:
    """Move the hoisted nodes into a new region of the same HOP (same flags); returns its
    getitems, one per sink."""
    kind = hop_kind(hop)
    region = torch.fx.Graph()
    used = [p for p in sources if any(u in hoisted for u in p.users)]
    env = {p: region.placeholder(p.name) for p in used}
    for p in used:
        env[p].meta = copy.copy(p.meta)
    for n in hoisted:  # a get_attr resolves in the region: GraphModule copies it from `body`
        env[n] = copy_keeping_name(region, n, env.__getitem__)
    region.output(tuple(env[s] for s in sinks))
    name = free_attribute(gm, "submod_folded")
    setattr(gm, name, graph_module(body, region, body.__class__.__name__))
    attr = gm.graph.get_attr(name)
    call = gm.graph.call_function(
        hop.target, tuple(hop.args[: kind.bodies[0]]) + (attr,) + tuple(sources[p] for p in used)
    )
    call.meta["val"] = tuple(s.meta.get("val") for s in sinks)
    # The region stands for every node moved into it; its getitems are glue (no decision).
    mark_hoisted(call, tuple(p for n in hoisted if n.op == "call_function" for p in report_names(n, path + n.name)))
    out = []
    for i, s in enumerate(sinks):
        g = gm.graph.call_function(operator.getitem, (call, i))
        g.meta = copy.copy(s.meta)
        mark_glue(g)
        out.append(g)
    return out


def _placeholder(graph: torch.fx.Graph, name: str, val) -> torch.fx.Node:
    p = graph.create_node("placeholder", name, name=name)
    p.target = p.name
    p.meta = {"val": val}
    return p


def _replace_with_operands(body, hoisted, sinks, new_operands, value_of, clone_op) -> None:
    """Give `body` one new placeholder per new operand (all bodies of a HOP take the same
    operands), read its own sinks from them, and delete the `hoisted` nodes."""
    graph = body.graph
    own = {value_of[s]: s for s in sinks}
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        placeholders = [_placeholder(graph, own[v].name if v in own else v.name, v.meta.get("val"))
                        for v in new_operands]
    placeholder_of = dict(zip(new_operands, placeholders))
    for s in sinks:
        s.replace_all_uses_with(placeholder_of[value_of[s]])
    for n in reversed(hoisted):  # in graph order: readers go first
        graph.erase_node(n)
    _copy_returned_operands(graph, set(placeholders), clone_op)


def _copy_returned_operands(graph: torch.fx.Graph, new: set[torch.fx.Node], clone_op) -> None:
    """Each place the body returns a moved value gets a copy of its own: torch's HOP
    functionalization rejects outputs that alias an operand or each other
    (``torch/_higher_order_ops/utils.py``, ``_check_alias_and_mutation``)."""
    output = graph.output_node()

    def copy_of(a: torch.fx.Node) -> torch.fx.Node:
        if a not in new:
            return a
        c = graph.call_function(clone_op, (a,))
        c.meta = {"val": a.meta.get("val")}
        mark_glue(c)
        return c

    with graph.inserting_before(output):
        output.args = torch.fx.map_arg(output.args, copy_of)


def _drop_unused_operands(hop: torch.fx.Node) -> None:
    """Remove the invariant operands that no body reads any more, with their placeholders."""
    kind = hop_kind(hop)
    operands = kind.invariant_operands(hop)
    per_body = [[n for n in body.graph.nodes if n.op == "placeholder"][kind.varying(hop):] for _, body in bodies(hop)]
    unused = [i for i in range(len(operands)) if all(not phs[i].users for phs in per_body)]
    for (_, body), phs in zip(bodies(hop), per_body):
        for i in unused:
            body.graph.erase_node(phs[i])
    hop.args = kind.with_operands(hop, [o for i, o in enumerate(operands) if i not in unused])


def sink_kept_code(gm: torch.fx.GraphModule, prefix: str = "") -> bool:
    """Put the code that `hoist_body_constants` moved out of a body and that the fold kept at
    runtime back into that body (code out of a region that runs once, ``no_grad`` or autocast,
    stays before it). `gm`: the folded program's graph module, edited in place, nested bodies
    included. Returns whether it changed `gm`."""
    changed = False
    reserve_node_names(gm)
    for hop in hop_nodes(gm.graph):
        kind = hop_kind(hop)
        paths = tuple(body_path(prefix, hop, attr) for attr, _ in bodies(hop))
        runs_once = kind.invariant_arg is None  # a region: only code of a body nested in it goes back
        operands = [o for o in kind.invariant_operands(hop) if isinstance(o, torch.fx.Node)]
        code = _hoisted_code(operands, lambda p: p.startswith(paths) and not (runs_once and "/" not in p[len(paths[0]):]))
        if code:
            changed = True
            _sink(gm, hop, code)
        for path, (_, body) in zip(paths, bodies(hop)):
            if sink_kept_code(body, path):
                recompile_shallow(body)
    return changed


def _hoisted_code(operands: list[torch.fx.Node], came_from) -> list[torch.fx.Node]:
    """The nodes hoisted from a body path `came_from` accepts that compute `operands`, with
    what they read of such nodes, in graph order."""
    def moved(n: torch.fx.Node) -> bool:
        if n.op != "call_function":
            return n.op == "get_attr"
        if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node):
            n = n.args[0]  # a region's output
        paths = n.meta.get(HOISTED_FROM, ())
        return any(came_from(p) for p in (paths if isinstance(paths, tuple) else (paths,)))

    code = _read([o for o in operands if o.op == "call_function" and moved(o)], moved)
    return [n for n in next(iter(code)).graph.nodes if n in code] if code else []


def _read(nodes: list[torch.fx.Node], within) -> set[torch.fx.Node]:
    out: set[torch.fx.Node] = set()
    work = list(nodes)
    while work:
        n = work.pop()
        if n not in out:
            out.add(n)
            work.extend(i for i in n.all_input_nodes if within(i))
    return out


def _sink(gm: torch.fx.GraphModule, hop: torch.fx.Node, code: list[torch.fx.Node]) -> None:
    """Copy `code` into each body of `hop` that reads one of its values, reading what `code`
    reads as operands; `code` leaves `gm`."""
    kind = hop_kind(hop)
    operands = kind.invariant_operands(hop)
    inputs = list(dict.fromkeys(i for n in code for i in n.all_input_nodes if i not in code))
    kept = [o for o in operands if o not in code]
    for _, body in bodies(hop):
        graph = body.graph
        placeholder_of = dict(zip(operands, [n for n in graph.nodes if n.op == "placeholder"][kind.varying(hop):]))
        sunk = {o: placeholder_of[o] for o in operands if o in code}
        needed = _read([o for o, p in sunk.items() if p.users], set(code).__contains__)
        with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
            env = {i: placeholder_of.get(i) or _placeholder(graph, i.name, i.meta.get("val")) for i in inputs}
            for n in code:
                if n in needed:
                    env[n] = (move_attribute(body, gm, n.target, graph) if n.op == "get_attr" else graph.node_copy(n, env.__getitem__))
        for o, p in sunk.items():
            if p.users:
                p.replace_all_uses_with(env[o])
            graph.erase_node(p)
        recompile_shallow(body)
    hop.args = kind.with_operands(hop, kept + [i for i in inputs if i not in kept])
    for n in reversed(code):
        if not n.users:
            gm.graph.erase_node(n)

