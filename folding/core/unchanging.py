"""Which stored inputs have the same value at every call: the one rule every stage and rewrite
that reads a stored tensor's value at fold time asks.

A parameter, buffer or lifted constant changes between calls when the signature writes it back
(`signature.mutated_targets`), or an op writes it in place, directly, through a view, or in the
body of a control-flow call that passes it (``with torch.no_grad(): self.w.mul_(0.5)``): the
graph's alias classes (`alias_classes`), which the signature does not show.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputSpec

from ..control_flow.hops import bodies, unprobed_writes
from .ops import OpKind, arg_at, op_facts, written_arg_positions
from .signature import STORED_KINDS, input_specs_by_name, mutated_targets

Writes = Mapping[torch.fx.Node, Iterable[torch.fx.Node]]


def alias_classes(nodes: Iterable[torch.fx.Node], kind: Optional[Mapping[torch.fx.Node, OpKind]] = None,
                  extra_writes: Optional[Writes] = None) -> tuple[dict, dict, dict]:
    """The alias classes of `nodes` (a graph's nodes, in graph order), bodies of control-flow
    calls included.

    Args:
        kind: `OpKind` per call_function node (computed when None).
        extra_writes: per op, inputs it writes although no rule says so (learnt or assumed).

    Returns:
        ``(alias_root, mutators, writes)``: the root node of every aliasing op's value (views,
        in-place ops, getitems of them); per alias root, the ops that update it in place, in
        graph order; per writing op, the inputs it writes (`ops.written_arg_positions`,
        `extra_writes`, and every operand of a control-flow call whose bodies write one of
        their placeholders).
    """
    return _alias_classes(nodes, kind, extra_writes or {}, {})


def _alias_classes(nodes, kind, extra_writes, memo: dict[int, bool]) -> tuple[dict, dict, dict]:
    alias_root: dict[torch.fx.Node, torch.fx.Node] = {}
    mutators: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    writes: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in nodes:
        if n.op != "call_function":
            continue
        facts = op_facts(n.target)
        k = kind[n] if kind is not None else facts.kind
        if k is OpKind.GETITEM:
            src = n.args[0]
            if isinstance(src, torch.fx.Node) and src in alias_root:
                alias_root[n] = alias_root[src]
            continue
        if facts.aliased_position is not None:
            src = arg_at(n, facts.aliased_position)
            if isinstance(src, torch.fx.Node):
                alias_root[n] = alias_root.get(src, src)
        passed = _bodies_write_operands(n, memo) if k is OpKind.CONTROL_FLOW else []
        if not (facts.mutated_positions or facts.undeclared_writes or n in extra_writes or passed):
            continue  # writes nothing
        written = [arg_at(n, p) for p in written_arg_positions(n)] + list(extra_writes.get(n, ())) + passed
        for dst in dict.fromkeys(d for d in written if isinstance(d, torch.fx.Node)):
            writes.setdefault(n, []).append(dst)
            mutators.setdefault(alias_root.get(dst, dst), []).append(n)
    return alias_root, mutators, writes


def _bodies_write_operands(node: torch.fx.Node, memo: dict[int, bool]) -> list[torch.fx.Node]:
    """The operands of the control-flow call `node` (not ``get_attr``s) when one of its bodies
    writes one of its placeholders, else none. Every operand: which operand feeds which
    placeholder differs per higher-order op, and one kept too many costs only folding."""
    for _, body in bodies(node):
        if id(body) not in memo:
            memo[id(body)] = False
            _, mutators, _ = _alias_classes(body.graph.nodes, None, {}, memo)
            memo[id(body)] = any(root.op == "placeholder" for root in mutators)
        if memo[id(body)]:
            return [i for i in node.all_input_nodes if i.op != "get_attr"]
    return []


def unchanging_stored_specs(graph: torch.fx.Graph, signature: ExportGraphSignature,
                            extra_writes: Optional[Writes] = None) -> dict[str, InputSpec]:
    """{placeholder name: InputSpec} of the parameters, buffers and lifted constants of `graph`
    (a top-level graph) neither written back by `signature` nor written in place by an op of
    `graph` or `extra_writes`."""
    specs = input_specs_by_name(signature)
    mutated = mutated_targets(signature)
    _, mutators, _ = alias_classes(graph.nodes, extra_writes=extra_writes)
    written = {root.name for root in mutators if root.op == "placeholder"}
    return {name: s for name, s in specs.items()
            if s.kind in STORED_KINDS and s.target not in mutated and name not in written}


def unchanging_before_probes(program: ExportedProgram) -> dict[str, InputSpec]:
    """`unchanging_stored_specs` for a decision made before evaluation probes custom ops
    (prepare's rewrites, inlining a ``cond``, QNN's partition fold): a custom op, or a
    control-flow call whose bodies call one, is taken to write every tensor it reads."""
    graph = program.graph
    return unchanging_stored_specs(graph, program.graph_signature, unprobed_writes(graph, in_body=True))
