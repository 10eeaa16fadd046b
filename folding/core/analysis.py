"""Which values of a program are constant, and why the others are not: a pure function of
the graph, its signature and the policy (JAX ``partial_eval``'s known/unknown split).

Constant sources: parameters, buffers the program does not mutate, lifted tensor constants, ops
with no tensor inputs (``full``, ``arange``); every non-tensor argument is constant (executorch's
``constant_prop_pass`` rejects ``memory_format=``). A value and its views form an alias class
rooted at the op that allocated it; a class updated in place folds only when every update is
constant and no runtime op reads it before its last update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

import torch
import torch.fx
from torch.export.graph_signature import ExportGraphSignature, InputSpec

from .ops import OpKind, op_facts, op_name, packet_name
from .unchanging import alias_classes
from ..control_flow.hops import evaluable
from ..policy import FoldPolicy
from ..reasons import Reason
from .signature import STORED_KINDS, input_specs_by_name, mutated_targets
from .symbols import has_symbols, input_symbols
from .ops import SYM_TYPES, holds_tensors, is_scalar

# Kinds of op never evaluated at fold time, whatever their inputs.
_KEPT_KINDS = {OpKind.MEMORY: Reason.MEMORY_OP, OpKind.RANDOM: Reason.RANDOM, OpKind.EFFECTFUL: Reason.EFFECTFUL}


@dataclass
class Analysis:
    """Result of `analyze`.

    Attributes:
        order: position of every node in graph order.
        reason: for every placeholder and call_function node: None when the value is constant,
            else why not (placeholders: RUNTIME_INPUT or READS_MUTATED_BUFFER).
        detail: free text per kept node (the kept input it depends on).
        kind: `OpKind` per call_function node.
        specs: InputSpec per placeholder name.
        alias_root: root node of every aliasing op's value (views, in-place ops).
        mutators: per alias root, the in-place ops that update it, in graph order.
        writes: per op that writes some of its inputs, those inputs (`unchanging.alias_classes`).
        forced: nodes kept regardless, with (reason, detail).
    """

    order: dict[torch.fx.Node, int]
    reason: dict[torch.fx.Node, Optional[Reason]]
    detail: dict[torch.fx.Node, str]
    kind: dict[torch.fx.Node, OpKind]
    specs: dict[str, InputSpec]
    alias_root: dict[torch.fx.Node, torch.fx.Node]
    mutators: dict[torch.fx.Node, list[torch.fx.Node]]
    writes: dict[torch.fx.Node, list[torch.fx.Node]] = field(default_factory=dict)
    fold_asserts: bool = True
    forced: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)

    def is_constant(self, node: torch.fx.Node) -> bool:
        return node in self.reason and self.reason[node] is None

    def is_check(self, node: torch.fx.Node) -> bool:
        """An assertion on constant inputs, evaluated at fold time and dropped."""
        return self.kind.get(node) is OpKind.ASSERTION and self.reason.get(node) is None

    def class_of(self, node: torch.fx.Node) -> Optional[torch.fx.Node]:
        """The alias root of `node` when its class is updated in place, else None."""
        root = self.alias_root.get(node, node)
        return root if root in self.mutators else None


def analyze(graph: torch.fx.Graph, signature: ExportGraphSignature, policy: FoldPolicy,
            forced: Optional[Mapping[torch.fx.Node, tuple[Reason, str]]] = None,
            extra_writes: Optional[Mapping[torch.fx.Node, Iterable[torch.fx.Node]]] = None) -> Analysis:
    """Classify every node of `graph` as constant or kept-with-a-reason.

    Args:
        graph: the program's top-level graph (nested control-flow graphs are opaque).
        policy: supplies ``skip_targets`` and ``fold_asserts``.
        forced: nodes to keep regardless (after an in-place class failed to evaluate).
        extra_writes: per op, inputs it was seen writing at fold time although no rule says
            so; they count as in-place updates.

    O(nodes + edges) per pass; a second pass runs only when an in-place class must be kept.
    """
    specs = input_specs_by_name(signature)
    mutated = mutated_targets(signature)
    skip = policy.skip_names()
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    kind = {n: op_facts(n.target).kind for n in nodes if n.op == "call_function"}
    alias_root, mutators, writes = alias_classes(nodes, kind, extra_writes)
    analysis = Analysis(order, {}, {}, kind, specs, alias_root, mutators, writes,
                        fold_asserts=policy.fold_asserts, forced=dict(forced or {}))
    while True:
        _propagate(analysis, nodes, mutated, skip)
        tainted = _taint_mutated_classes(analysis)
        if not tainted:
            return analysis
        analysis.forced.update(tainted)


def _propagate(analysis: Analysis, nodes, mutated_targets, skip) -> None:
    reason, detail, specs, forced = analysis.reason, analysis.detail, analysis.specs, analysis.forced
    reason.clear()
    detail.clear()
    for n in nodes:
        if n.op == "placeholder":
            spec = specs.get(n.name)
            if spec is None or spec.kind not in STORED_KINDS:
                reason[n] = Reason.RUNTIME_INPUT  # user inputs, effect tokens, custom objects
            elif spec.target in mutated_targets or n in analysis.mutators:
                reason[n] = Reason.READS_MUTATED_BUFFER
            else:
                reason[n] = None
        elif n.op == "get_attr":
            reason[n] = None  # submodules of control-flow ops; only CONTROL_FLOW ops read them
        elif n.op == "call_function":
            r, d = _node_reason(n, analysis, skip)
            if r is None and n in forced:
                r, d = forced[n]
            reason[n] = r
            if d:
                detail[n] = d


def _node_reason(n: torch.fx.Node, analysis: Analysis, skip) -> tuple[Optional[Reason], str]:
    reason = analysis.reason
    runtime: list[torch.fx.Node] = []
    kept: Optional[tuple[torch.fx.Node, Reason]] = None
    metadata_arg = _metadata_only_arg(n)
    for i in n.all_input_nodes:
        if i is metadata_arg:
            continue
        r = reason.get(i)
        if r is Reason.RUNTIME_INPUT or r is Reason.SYMBOLIC:
            runtime.append(i)
        elif r is not None and kept is None:
            kept = (i, r)
    if runtime:
        return _runtime_reason(n, runtime, reason)
    if kept is not None:
        i, r = kept
        if i.op == "placeholder" and r is Reason.READS_MUTATED_BUFFER:
            return Reason.READS_MUTATED_BUFFER, i.name
        return Reason.DEPENDS_ON_KEPT, f"{i.name}: {r.name}"

    k = analysis.kind[n]
    if k in _KEPT_KINDS:
        return _KEPT_KINDS[k], ""
    if k is OpKind.CONTROL_FLOW and not evaluable(n):
        return Reason.CONTROL_FLOW, ("not a control-flow op with plain bodies, or its bodies draw random numbers "
                                     "or have side effects")
    if skip and (op_name(n.target) in skip or packet_name(n.target) in skip):
        return Reason.SKIPPED_TARGET, ""
    val = n.meta.get("val")
    if k is OpKind.ASSERTION:
        return (None, "") if analysis.fold_asserts else (Reason.EFFECTFUL, "")
    # Every input is constant here: a symbol left is data-dependent (``item()`` of a constant),
    # which evaluation fixes and `lift` substitutes.
    if "val" in n.meta and not (holds_tensors(val) or is_scalar(val)):
        return Reason.NOT_A_TENSOR, type(val).__name__
    symbols = input_symbols(val)
    if symbols:  # never evaluated: only a runtime call gives these sizes
        return Reason.SYMBOLIC, f"its shape has free symbols {', '.join(symbols)}"
    return None, ""


def _metadata_only_arg(n: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The first argument of a metadata-only op (``new_zeros``, ``zeros_like``) when its shape
    and strides are static: its values are never read."""
    if op_facts(n.target).metadata_only and n.args and isinstance(n.args[0], torch.fx.Node):
        val = n.args[0].meta.get("val")
        if isinstance(val, torch.Tensor) and not has_symbols(val):
            return n.args[0]
    return None


def _runtime_reason(n: torch.fx.Node, runtime: list[torch.fx.Node], reason) -> tuple[Reason, str]:
    """Why `n`, which reads `runtime` inputs, is not folded: ``SYMBOLIC`` when it reads only
    sizes (symbolic scalars, or the free-symbol shape a metadata-only op such as ``full_like``
    copies), naming the free symbols; else ``RUNTIME_INPUT``."""
    shape_source = n.args[0] if op_facts(n.target).metadata_only and n.args else None
    sized = [i for i in runtime if reason[i] is Reason.SYMBOLIC or isinstance(i.meta.get("val"), SYM_TYPES)]
    shaped = [i for i in runtime if i is shape_source and input_symbols(i.meta.get("val"))]
    if len(sized) + len(shaped) < len(runtime):
        return Reason.RUNTIME_INPUT, ""
    first = (shaped + sized)[0]
    symbols = ", ".join(input_symbols(first.meta.get("val")))
    if first in shaped:
        return Reason.SYMBOLIC, f"shaped like {first.name}, whose shape has free symbols {symbols}"
    return Reason.SYMBOLIC, f"reads symbolic {first.name}" + (f" (free symbols {symbols})" if symbols else "")


def _taint_mutated_classes(analysis: Analysis) -> dict[torch.fx.Node, tuple[Reason, str]]:
    """Keep whole alias classes whose in-place updates cannot all happen at fold time."""
    if not analysis.mutators:
        return {}
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n, root in analysis.alias_root.items():
        if root in analysis.mutators:
            members.setdefault(root, []).append(n)
    tainted: dict[torch.fx.Node, tuple[Reason, str]] = {}
    reason, order = analysis.reason, analysis.order
    for root, muts in analysis.mutators.items():
        if root.op != "call_function" or reason.get(root) is not None:
            continue  # placeholders are mutated buffers; a kept root keeps its class anyway
        cls = [root] + members.get(root, [])
        if any(m in analysis.forced for m in cls):
            continue
        runtime_mut = next((m for m in muts if reason.get(m) is not None), None)
        if runtime_mut is not None:
            tainted.update(dict.fromkeys(cls, (Reason.MUTATED_BY_RUNTIME_OP, runtime_mut.name)))
            continue
        last, mut_set = max(order[m] for m in muts), set(muts)
        early = next(((u, m) for m in cls for u in m.users if u.op != "output" and u not in mut_set
                      and reason.get(u) is not None and order[u] < last), None)
        if early is not None:
            verdict = (Reason.MUTATED_AFTER_RUNTIME_READ, f"{early[0].name} reads {early[1].name}")
            tainted.update(dict.fromkeys(cls, verdict))
    return tainted
