"""Constant code inside control-flow bodies: move it to the graph that calls the body.

A body of ``cond``, ``while_loop``, ``map_impl``, ``scan`` or a ``wrap_with_*`` region sees
its operands as placeholders. A placeholder fed by the same constant at every call (a weight
passed to a branch, a loop's additional inputs; never the carry or a mapped slice) is a
constant source inside the body, and the body code that reads only such sources is loop- and
branch-invariant. `hoist_body_constants` moves that code out, into the graph that calls the
body (loop-invariant code motion), and passes each value the body still reads back in as a
new operand of the HOP. The top-level fold then folds the moved code like any other constant
code: size limits, kept dequantizes and deduplication apply unchanged, and the value becomes
a lifted constant fed to the HOP.

Nested bodies are processed innermost first, so constant code climbs every level whose
operands are constant. Code from an autocast region is moved into a region of its own (same
device, dtype and flags) so that it computes exactly what it did. Nodes named in `pins` stay
in their body: the fold keeps them at runtime (size limit, kept encoding, an op that raises),
and a kept op belongs where it ran before (an op that raises in an untaken branch must not
run unconditionally).
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

from .torch_internals import program_with
from .hops import (bodies, copy_uncompiled, drop_unused_attributes, free_attribute, graph_module, hop_kind, hop_nodes,
                   move_attribute, recompile_shallow, unprobed_writes)
from .names import copy_keeping_name, reserve_node_names
from .node_meta import GLUE, body_path, mark_glue, mark_hoisted, pin_name, report_names
from .ops import OpKind, op_name
from .policy import FoldPolicy
from .reasons import Reason
from .report import Decision

def has_bodies(gm: torch.fx.GraphModule) -> bool:
    return bool(hop_nodes(gm.graph))


@dataclass(frozen=True)
class Hoisting:
    """What `hoist_body_constants` made.

    Attributes:
        program: the program with the constant code of its bodies moved out (a copy, or the
            program given when it was its to edit or nothing applied).
        owned: the GraphModules this call made (copies of the caller's bodies, new regions,
            the top-level copy): the stages after it may edit them in place.
        decisions: the decisions of the nodes left in the bodies (`BodySplit.decisions`), every
            body, nested ones included.
    """

    program: ExportedProgram
    owned: frozenset
    decisions: tuple[Decision, ...] = ()


def hoist_body_constants(
    program: ExportedProgram, policy: FoldPolicy, clone_op, pins: Mapping[str, tuple[Reason, str]] = {}, *,
    analyze, inplace: bool = False
) -> Hoisting:
    """`program` with the constant code of every body moved to its caller: a copy (the graphs
    it edits copied; tensors, signature, dicts and untouched bodies shared), or `program`
    itself when it has no control-flow body. The copy's graphs compile on first use
    (`copy_uncompiled`): a body when it runs (evaluated whole, or at runtime); the top-level
    copy is never called (`lift` reads it and builds the folded graph anew,
    `folding/working.py`).

    Args:
        clone_op: the program dialect's copy op, inserted where a body returns a value that
            is now one of its operands (a body output must not alias its input).
        pins: body paths (``cond.true_graph_0/linear``) of nodes that stay in their body, with
            the reason and detail the fold kept them for.
        analyze: `analysis.analyze` (the driver passes it: a stage never imports another).
        inplace: `program`'s top-level graph module is the caller's own copy (`copy_uncompiled`
            of a program it must not change): edit it instead of copying it again. Its bodies
            are still copied on first edit.
    """
    if not has_bodies(program.graph_module):
        return Hoisting(program, frozenset())
    gm = program.graph_module if inplace else copy_uncompiled(program.graph_module)[0]
    reserve_node_names(gm)
    hoist = _Hoist(policy, clone_op, pins, gm, analyze)
    hoist.unshare(gm)  # before the analysis: it may add get_attr nodes to `gm`
    top = analyze(gm.graph, program.graph_signature, policy, extra_writes=unprobed_writes(gm.graph, in_body=False))
    hoist.graph(gm, top.is_constant, "")
    for module in hoist.changed:  # copies this pass made: what they no longer read goes
        drop_unused_attributes(module)
        recompile_shallow(module)  # the code is stale: compiled on first use
    result = program if inplace else program_with(program, graph_module=gm)
    return Hoisting(result, frozenset(hoist.changed), tuple(hoist.decisions))


def body_signature(placeholders: list[torch.fx.Node], constant: set[torch.fx.Node]) -> ExportGraphSignature:
    """A signature under which `analyze` treats a body's `constant` placeholders as stored
    constants and the others as runtime inputs."""
    specs = [
        InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(p.name), p.name)
        if p in constant
        else InputSpec(InputKind.USER_INPUT, TensorArgument(p.name), None)
        for p in placeholders
    ]
    return ExportGraphSignature(input_specs=specs, output_specs=[])


def constant_placeholders(hop: torch.fx.Node, body: torch.fx.GraphModule, is_constant) -> dict[torch.fx.Node, torch.fx.Node]:
    """Body placeholder -> the caller's operand, for the placeholders fed by the same constant
    at every call of the body."""
    kind = hop_kind(hop)
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    operands = kind.invariant_operands(hop)
    return {
        p: o
        for p, o in zip(placeholders[kind.varying(hop):], operands)
        if isinstance(o, torch.fx.Node) and is_constant(o)
    }


@dataclass(frozen=True)
class BodySplit:
    """Which nodes of a body move to its caller (`split_body`); the body is not changed.

    Attributes:
        sources: the body's placeholders fed by a constant operand -> that operand.
        hoisted: the nodes that move, in graph order.
        sinks: the hoisted nodes that something left in the body reads (it reads them as new
            operands after the move).
        decisions: one per call_function node that stays, under its report names: why it stays
            (a runtime operand, the loop carry or a mapped slice; a pin; a check).
    """

    sources: dict[torch.fx.Node, torch.fx.Node]
    hoisted: dict[torch.fx.Node, None]
    sinks: list[torch.fx.Node]
    decisions: tuple[Decision, ...] = ()


def split_body(body: torch.fx.GraphModule, sources: dict[torch.fx.Node, torch.fx.Node], policy: FoldPolicy,
               pins: Mapping[str, tuple[Reason, str]], path: str, analyze) -> BodySplit:
    """The constant nodes of `body` that move out: in order, those whose inputs are constant
    operands (`sources`) or nodes moved before them; checks, pinned nodes (`pins`, by body
    path) and what reads them stay, and so does a nested body (get_attr) that a HOP left in
    the body calls. A tensor attribute moves out whatever reads it: it becomes an operand,
    then a lifted constant. Pure: `body` is only read (its node names are reserved).
    `analyze`: `analysis.analyze`, which the driver passes in."""
    analysis = _analyze_body(body, sources, policy, analyze)
    excluded: set[torch.fx.Node] = set()
    while True:
        out: dict[torch.fx.Node, None] = {}
        for n in body.graph.nodes:
            if n.op not in ("call_function", "get_attr") or not analysis.is_constant(n) or n in excluded:
                continue
            if analysis.kind.get(n) is OpKind.ASSERTION or pin_name(n, path) in pins:
                continue
            if all(i in out or i in sources for i in n.all_input_nodes):
                out[n] = None
        stay = {n for n in out if n.op == "get_attr" and any(u not in out for u in n.users)
                and isinstance(getattr(body, n.target, None), torch.nn.Module)}
        if not stay:
            break
        excluded |= stay
    sinks = [n for n in out if any(u not in out for u in n.users)]
    return BodySplit(sources, out, sinks, _staying(body, out, analysis, pins, path))


def _staying(body, hoisted, analysis, pins, path) -> tuple[Decision, ...]:
    """The decisions of the call_function nodes of `body` that stay (not `hoisted`)."""
    out = []
    for n in body.graph.nodes:
        if n.op != "call_function" or n in hoisted:
            continue
        for name in report_names(n, path + n.name):  # none for glue
            reason, detail = analysis.reason[n], analysis.detail.get(n, "")
            if reason is None:
                reason, detail = pins.get(name) or (Reason.CONTROL_FLOW, "a check on constants runs where its body runs")
            elif reason is Reason.RUNTIME_INPUT:
                detail = "reads a runtime operand, the loop carry or a mapped slice"
            out.append(Decision(name, op_name(n.target), reason, detail))
    return tuple(out)


def _analyze_body(body: torch.fx.GraphModule, sources, policy: FoldPolicy, analyze):
    """`analyze` of a body whose `sources` placeholders are constant (the others runtime)."""
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    reserve_node_names(body)
    return analyze(body.graph, body_signature(placeholders, set(sources)), policy,
                   extra_writes=unprobed_writes(body.graph, in_body=True))


class _Hoist:
    """Rewrites what `split_body` decided, on copies: a body two calls share is first copied
    for each (`unshare`); a body the caller's program holds is copied on its first edit
    (`_own`); the moved nodes go before the HOP (`_copy_hoisted`) or
    into a new autocast region around them (`_wrap_hoisted`, autocast only: code moved out of a
    ``no_grad`` region needs none, folding computes no gradients); the body then
    reads them as new operands (`_replace_with_operands`)."""

    def __init__(self, policy: FoldPolicy, clone_op, pins: Mapping[str, tuple[Reason, str]],
                 top: torch.fx.GraphModule, analyze) -> None:
        self.policy, self.clone_op, self.pins, self.analyze = policy, clone_op, pins, analyze
        self.decisions: list[Decision] = []  # of the nodes left in the bodies
        # Graphs this pass owns (copies; the caller's bodies are copied on first edit), each
        # recompiled once at the end.
        self.changed: dict[torch.fx.GraphModule, None] = {top: None}

    def unshare(self, gm: torch.fx.GraphModule) -> None:
        """Give every body slot of `gm`'s HOPs (nested ones included) an attribute of its own:
        a body that a second slot calls (two ``cond`` nodes, a ``cond`` and a ``map_impl``,
        both branches of one ``cond``) is copied for that slot, under a free name. Each call
        then gets its own rewrite (new operands, code moved out): editing a shared body for
        one call would break the other (``forward() missing 1 required positional
        argument``). torch.export never shares a body, but ``to_edge`` accepts a program that
        does (it traces each call anew). `gm` must be this pass's own copy; a body with a
        shared body inside is copied before it is edited."""
        seen: dict[str, torch.fx.GraphModule] = {}  # target -> the body it named first
        for hop in hop_nodes(gm.graph):
            args = list(hop.args)
            for position in hop_kind(hop).bodies:
                a = args[position]
                body = getattr(gm, a.target, None) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None
                if not isinstance(body, torch.fx.GraphModule):
                    continue
                if a.target in seen:  # a second slot: a copy of the first body (not of an
                    body = self._copy(seen[a.target])  # owned copy: its bodies are owned)
                    name = free_attribute(gm, a.target)
                    setattr(gm, name, body)
                    with gm.graph.inserting_before(hop):
                        args[position] = gm.graph.create_node("get_attr", name)
                    args[position].meta = copy.copy(a.meta)
                else:
                    seen[a.target] = body
                if _shares_bodies(body):
                    if body not in self.changed:
                        body = self._copy(body)
                        setattr(gm, args[position].target, body)
                    self.unshare(body)
            hop.args = tuple(args)

    def _copy(self, body: torch.fx.GraphModule) -> torch.fx.GraphModule:
        copied, _ = copy_uncompiled(body)
        self.changed[copied] = None
        return copied

    def _own(self, gm, attr: str, body):
        """`body`, copied into `gm` under `attr` unless it is a copy already; and the map from
        the original's nodes (None when `body` was already owned)."""
        if body in self.changed:
            return body, None
        copied, env = copy_uncompiled(body)  # `unshare` made `attr` this call's own
        setattr(gm, attr, copied)
        self.changed[copied] = None
        return copied, env

    def graph(self, gm: torch.fx.GraphModule, is_constant: Callable[[torch.fx.Node], bool], prefix: str) -> None:
        for hop in hop_nodes(gm.graph):
            self.hop(gm, hop, is_constant, prefix)

    def hop(self, gm, hop, is_constant, prefix) -> None:
        kind = hop_kind(hop)
        plans = []
        for attr, body in bodies(hop):
            path = body_path(prefix, hop, attr)
            if has_bodies(body):  # nested control flow: its bodies are edited first
                body, _ = self._own(gm, attr, body)
                analysis = _analyze_body(body, constant_placeholders(hop, body, is_constant), self.policy, self.analyze)
                self.graph(body, analysis.is_constant, path)
            split = split_body(body, constant_placeholders(hop, body, is_constant), self.policy, self.pins, path,
                               self.analyze)
            self.decisions.extend(split.decisions)
            plans.append((attr, body, split, path))
        if not any(split.hoisted for _, _, split, _ in plans):
            return  # the bodies stay the caller's, untouched
        moved: list[tuple[torch.fx.GraphModule, list[torch.fx.Node]]] = []
        value_of: dict[torch.fx.Node, torch.fx.Node] = {}  # sink -> the caller's node for it
        for attr, body, split, path in plans:
            body, env = self._own(gm, attr, body)
            sources, hoisted, sinks = split.sources, split.hoisted, split.sinks
            if env is not None:  # the split was made on the caller's body: map it to the copy
                sources = {env[p]: o for p, o in sources.items()}
                hoisted = {env[n]: None for n in hoisted}
                sinks = [env[n] for n in sinks]
            if hoisted:
                with gm.graph.inserting_before(hop):
                    if kind.wraps:
                        values = _wrap_hoisted(gm, hop, body, hoisted, sinks, sources, path)
                    else:
                        values = _copy_hoisted(gm, body, hoisted, sinks, sources, path)
                value_of.update(zip(sinks, values))
            moved.append((body, sinks))
        new_operands = list(dict.fromkeys(value_of.values()))  # identical values passed once
        for body, sinks in moved:
            _replace_with_operands(body, sinks, new_operands, value_of, self.clone_op)
        hop.args = kind.with_operands(hop, kind.invariant_operands(hop) + new_operands)
        _drop_unused_operands(hop)


def _shares_bodies(gm: torch.fx.GraphModule) -> bool:
    """True when two body slots of `gm`'s HOPs, or of its bodies' HOPs, name one attribute."""
    targets = [attr for hop in hop_nodes(gm.graph) for attr, _ in bodies(hop)]
    return len(targets) != len(set(targets)) or any(_shares_bodies(getattr(gm, t)) for t in set(targets))


def _copy_hoisted(gm, body, hoisted, sinks, sources, path) -> list[torch.fx.Node]:
    """Copy the hoisted nodes into `gm` (before the HOP), one copy each: two nodes with the same
    op and inputs are two values when a write reaches either (``w.clone()`` twice, each written
    in place), so none is merged. Returns the copies of `sinks`."""
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
    """Move the hoisted nodes into a new region of the same HOP (same flags) called from
    `gm`; returns that region's outputs (getitem nodes), one per sink."""
    kind = hop_kind(hop)
    region = torch.fx.Graph()
    used = [p for p in sources if any(u in hoisted for u in p.users)]
    env = {p: region.placeholder(p.name) for p in used}
    for p in used:
        env[p].meta = copy.copy(p.meta)
    for n in hoisted:  # a get_attr resolves in the region: GraphModule copies it from `body`
        env[n] = copy_keeping_name(region, n, env.__getitem__)
    region.output(tuple(env[s] for s in sinks))
    region_gm = graph_module(body, region, body.__class__.__name__)
    name = free_attribute(gm, "submod_folded")
    setattr(gm, name, region_gm)
    attr = gm.graph.get_attr(name)
    call = gm.graph.call_function(
        hop.target, tuple(hop.args[: kind.bodies[0]]) + (attr,) + tuple(sources[p] for p in used)
    )
    call.meta["val"] = tuple(s.meta.get("val") for s in sinks)
    # The region stands for every node moved into it; its getitems are glue (no decision).
    mark_hoisted(call, _hoisted_paths(hoisted, path))
    out = []
    for i, s in enumerate(sinks):
        g = gm.graph.call_function(operator.getitem, (call, i))
        g.meta = copy.copy(s.meta)
        mark_glue(g)
        out.append(g)
    return out

def _replace_with_operands(body, sinks, new_operands, value_of, clone_op) -> None:
    """Give `body` one new placeholder per new operand (all bodies of a HOP take the same
    operands), read its own sinks from them, and delete the moved nodes."""
    graph = body.graph
    own = {value_of[s]: s for s in sinks}
    placeholders = []
    # After the existing placeholders; a body may have none (a region or branch whose
    # code reads no operand), so insert before the first other node.
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        for value in new_operands:
            name = own[value].name if value in own else value.name
            p = graph.create_node("placeholder", name, name=name)
            p.target = p.name
            p.meta = {"val": value.meta.get("val")}
            placeholders.append(p)
    placeholder_of = dict(zip(new_operands, placeholders))
    for s in sinks:
        s.replace_all_uses_with(placeholder_of[value_of[s]])
    for n in reversed(_moved_nodes(graph, sinks)):
        graph.erase_node(n)
    _copy_returned_operands(graph, set(placeholders), clone_op)

def _copy_returned_operands(graph: torch.fx.Graph, new: set[torch.fx.Node], clone_op) -> None:
    """A body may return neither one of its inputs nor one value twice: torch's HOP
    functionalization rejects outputs that alias an operand or each other
    (``torch/_higher_order_ops/utils.py``, ``_check_alias_and_mutation``: "cond_true might
    be aliasing the input or the output!"), which `to_edge_transform_and_lower` runs. So
    each place the body returns a moved value gets a copy of its own (a branch returning
    ``c.clone(), c.clone()`` of one constant ``c`` returns two copies of its operand)."""
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
    """Remove the invariant operands that no body reads any more (a weight whose only reader
    moved out), with their placeholders, so the caller stops passing (and storing) them."""
    kind = hop_kind(hop)
    operands = kind.invariant_operands(hop)
    per_body = []
    for _, body in bodies(hop):
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        per_body.append((body, placeholders[kind.varying(hop):]))
    unused = [i for i in range(len(operands)) if all(not phs[i].users for _, phs in per_body)]
    if not unused:
        return
    for body, phs in per_body:
        for i in unused:
            body.graph.erase_node(phs[i])
    hop.args = kind.with_operands(hop, [o for i, o in enumerate(operands) if i not in unused])


def _moved_nodes(graph: torch.fx.Graph, sinks: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """The nodes left without users after the sinks' readers were redirected: the sinks and
    what only they read, in graph order (deleted last to first)."""
    dead: set[torch.fx.Node] = set()
    work = list(sinks)
    while work:
        n = work.pop()
        if n in dead or n.op == "placeholder" or any(u not in dead for u in n.users):
            continue
        dead.add(n)
        work.extend(n.all_input_nodes)
    return [n for n in graph.nodes if n in dead]


def _hoisted_paths(nodes, path: str) -> tuple[str, ...]:
    """The body paths a region call made of `nodes` stands for: each op's own path, or the
    paths it was hoisted from (a region inside a region); none for glue."""
    out: list[str] = []
    for n in nodes:
        if n.op == "call_function" and not n.meta.get(GLUE):
            p = pin_name(n, path)
            out.extend(p if isinstance(p, tuple) else (p,))
    return tuple(out)
