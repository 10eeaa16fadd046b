"""Which constant nodes are folded away, which stay in the program, which values are stored.

Every constant node is a candidate; the ``_keep_*`` rules keep some in the program
(``Plan.runtime``), each with a `Reason`. A folded value is *materialised* (stored) when a node
that stays, or the output, reads it; a custom op that stays and reads a constant is *probed*:
run once on stand-ins to learn a write its schema does not declare (`ops.OpFacts.probed`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.fx

from .ops import is_clone
from .cuts import choose_cuts, find_regions, node_bytes
from .ops import OpKind, is_probed, op_facts, packet_name
from ..policy import FoldPolicy
from .quant import dequantized_values, is_dequantize
from ..reasons import Reason
from .torch_internals import make_contiguous_strides_for
from .ops import is_scalar

if TYPE_CHECKING:
    from .analysis import Analysis


@dataclass
class Plan:
    """Attributes:
    candidates: constant call_function nodes, in graph order (assertion checks included).
    runtime: candidates that stay in the graph, with (reason, detail).
    evaluated: nodes run at fold time, in graph order.
    materialise: folded-away nodes whose value a node left in the graph or the output reads.
    release: per evaluated node, the index in `evaluated` after which its value is no longer
        needed (its last evaluated reader, or the last in-place update of its alias class).
    probed: nodes in `evaluated` that stay in the program, run only to learn their writes.
    """

    candidates: list[torch.fx.Node]
    runtime: dict[torch.fx.Node, tuple[Reason, str]] = field(default_factory=dict)
    evaluated: list[torch.fx.Node] = field(default_factory=list)
    materialise: set[torch.fx.Node] = field(default_factory=set)
    release: dict[torch.fx.Node, int] = field(default_factory=dict)
    probed: set[torch.fx.Node] = field(default_factory=set)

    def folded(self, node: torch.fx.Node) -> bool:
        return node in self._candidate_set and node not in self.runtime

    def __post_init__(self) -> None:
        self._candidate_set = set(self.candidates)


def make_plan(analysis: Analysis, policy: FoldPolicy, placeholder_bytes: dict[torch.fx.Node, int], bytes_before: int,
              budget_cut: int = 0, cap_exempt: frozenset = frozenset()) -> Plan:
    """Plan the fold of every constant node within the policy's size limits.

    Args:
        placeholder_bytes: stored bytes of each constant placeholder (tensors shared by several
            placeholders count for the first only).
        bytes_before: the program's stored constant bytes, for the growth budget.
        budget_cut: bytes taken off the policy's growth budget (after a plan whose measured
            growth exceeded it).
        cap_exempt: names of nodes `max_tensor_bytes` does not apply to: each replaces a stored
            tensor of its own size (`transposed_gathers`).

    A rule that keeps a value after the size limits chose what to store makes its folded inputs
    stored values the limits did not count: the limits then run again, with it kept.
    """
    candidates = [n for n in analysis.order if n.op == "call_function" and analysis.reason.get(n) is None]
    plan = Plan(candidates)
    _keep_output_copies(plan)
    _keep_scalar_outputs(plan)
    _keep_encodings(plan)
    _keep_runtime_shaped_fills(plan, analysis)
    _keep_alias_classes_whole(plan, analysis)
    while True:
        _apply_size_limits(plan, analysis, policy, placeholder_bytes, bytes_before, budget_cut, cap_exempt)
        limited = len(plan.runtime)
        _keep_until_stable(plan, analysis, _keep_observed_layouts)
        _keep_until_stable(plan, analysis, _keep_unstorable_inputs)
        if len(plan.runtime) == limited:
            break
    _keep_checks_of_runtime_values(plan, analysis)
    _finish(plan, analysis)
    return plan


def _apply_size_limits(plan, analysis, policy, placeholder_bytes, bytes_before, budget_cut, cap_exempt) -> None:
    budget = policy.growth_budget(bytes_before)
    if budget is not None:
        budget -= budget_cut
    if policy.max_tensor_bytes is None and budget is None:
        return
    folded = [n for n in plan.candidates if plan.folded(n) and not analysis.is_check(n)]
    fixed = {n for n in folded if analysis.class_of(n) is not None}
    regions = find_regions(folded, plan.folded, set(placeholder_bytes), placeholder_bytes, fixed)
    sizes = {n: node_bytes(n) for r in regions for n in r.ops}
    cap = policy.max_tensor_bytes
    storable = {  # a scalar "stored" costs 0 bytes: it is inlined into its readers
        n for r in regions for n in r.ops
        if ("val" not in n.meta or _storable(n.meta["val"]))
        and (cap is None or sizes[n] <= cap or n.name in cap_exempt)
    }
    canon = _identical_values(folded, analysis)
    plan.runtime.update(choose_cuts(regions, sizes, placeholder_bytes, canon, cap, budget, storable))


def _identical_values(nodes: list[torch.fx.Node], analysis: Analysis) -> dict[torch.fx.Node, torch.fx.Node]:
    """Map each node to the first node of the same target on the same arguments, so that the
    planner counts their bytes once, as the emitter stores identical bytes once. A node a write
    reaches (a member or reader of an in-place class), an uninitialised allocation, or one with
    unhashable arguments is its own (torch.fx's ``cse_pass`` merges only functional code)."""
    canon: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[tuple, torch.fx.Node] = {}
    for n in nodes:
        canon[n] = n
        if op_facts(n.target).uninitialised or any(analysis.class_of(m) is not None for m in (n, *n.all_input_nodes)):
            continue
        try:
            key = (n.target, _frozen(n.args, canon), _frozen(n.kwargs, canon))
            canon[n] = seen.setdefault(key, n)
        except TypeError:  # an argument that cannot be hashed
            pass
    return canon


def _frozen(value, canon):
    """A hashable form of an argument, equal only when torch cannot tell two apart: scalars keyed
    by type (1, 1.0 and True give different dtypes), floats by their bits (-0.0 is not 0.0),
    a tensor literal by identity (alive for the whole fold)."""
    if isinstance(value, torch.fx.Node):
        return canon.get(value, value)
    if isinstance(value, (list, tuple)):
        return (type(value),) + tuple(_frozen(v, canon) for v in value)
    if isinstance(value, dict):
        return (dict,) + tuple(sorted((k, _frozen(v, canon)) for k, v in value.items()))
    if isinstance(value, float):
        return (float, struct.pack("<d", value))
    if isinstance(value, complex):
        return (complex, struct.pack("<dd", value.real, value.imag))
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, id(value))
    return (type(value), value)


def _keep_output_copies(plan: Plan) -> None:
    """A copy of a constant placeholder that only the output reads is how a folded program returns
    a constant (ExecuTorch cannot return a stored buffer): it stays, so a second fold is a no-op."""
    for n in plan.candidates:
        if (is_clone(n.target) and n.all_input_nodes and n.all_input_nodes[0].op == "placeholder"
                and n.users and all(u.op == "output" for u in n.users)):
            plan.runtime[n] = (Reason.OUTPUT_COPY, "")


def _keep_scalar_outputs(plan: Plan) -> None:
    """A scalar (``item()`` of a constant) is folded by writing its value into the ops that read
    it; the graph output cannot hold a literal, so a scalar the output returns stays an op."""
    for n in plan.candidates:
        if is_scalar(n.meta.get("val")) and any(u.op == "output" for u in n.users):
            plan.runtime[n] = (Reason.NOT_A_TENSOR, "a scalar returned as an output")


def _keep_encodings(plan: Plan) -> None:
    """Leave in the graph every dequantize (and float view/copy after it) whose value a runtime op
    would read, so its integer input is stored with its encoding (`quant`). The graph output
    reads no encoding: a dequantize only it reads folds to its float value (HTP cannot build it,
    ``could not create op``)."""
    dq = dequantized_values(plan.candidates)
    work = [n for n in plan.candidates if n in dq and any(u.op != "output" and not plan.folded(u) for u in n.users)]
    while work:
        n = work.pop()
        if n in plan.runtime:
            continue
        plan.runtime[n] = (Reason.KEEPS_ENCODING if is_dequantize(n.target) else Reason.AFTER_DEQUANTIZE, "")
        work.extend(i for i in n.all_input_nodes if i in dq and i not in plan.runtime)


def _keep_runtime_shaped_fills(plan: Plan, analysis: Analysis) -> None:
    """Leave in the graph a fill shaped like a runtime tensor (``full_like(x)``, SDPA's zero
    attention bias) that only runtime ops read: storing it costs all its bytes to save a fill."""
    for n in plan.candidates:
        if (plan.folded(n) and op_facts(n.target).metadata_only and n.args and isinstance(n.args[0], torch.fx.Node)
                and not analysis.is_constant(n.args[0]) and analysis.class_of(n) is None
                and n.users and not any(plan.folded(u) for u in n.users)):
            plan.runtime[n] = (Reason.FILL_OF_RUNTIME_SHAPE, f"shaped like runtime value {n.args[0].name}")


def _keep_alias_classes_whole(plan: Plan, analysis: Analysis) -> None:
    """An alias class updated in place folds whole or stays whole: when a rule keeps one member,
    the in-place updates must run on that runtime value, so every member stays."""
    if not analysis.mutators:
        return
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in plan.candidates:
        root = analysis.class_of(n)
        if root is not None:
            members.setdefault(root, []).append(n)
    for root, cls in members.items():
        cls = ([root] if root in plan._candidate_set and root not in cls else []) + cls
        kept = next((m for m in cls if m in plan.runtime), None)
        if kept is not None:
            verdict = (Reason.DEPENDS_ON_KEPT, f"in-place class of {root.name}: {kept.name} stays")
            for m in cls:
                plan.runtime.setdefault(m, verdict)


# Ops whose values depend on where their input's elements lie in memory, not only on the
# values: ``as_strided`` reads the storage directly.
_STORAGE_READERS = frozenset({"aten.as_strided", "aten.as_strided_copy", "aten.as_strided_scatter"})


def may_observe_layout(target: object) -> bool:
    """True for the targets `observes_layout` may accept: a random op, or ``as_strided`` and
    its siblings."""
    return packet_name(target) in _STORAGE_READERS or op_facts(target).kind is OpKind.RANDOM


def observes_layout(node: torch.fx.Node) -> bool:
    """True when `node`'s values depend on its tensor inputs' strides, so that a stored
    (canonical) copy of a strided input would change them:

    - a random op that reads a tensor (``randn_like``, ``bernoulli``, dropout) draws in the
      memory order of a result laid out like that tensor (``memory_format=preserve_format``):
      ``randn_like(w.permute(3, 1, 0, 2))`` draws different values for a contiguous ``w'``;
    - ``as_strided`` reads its input's storage.
    """
    if node.op != "call_function" or not may_observe_layout(node.target):
        return False
    if packet_name(node.target) in _STORAGE_READERS:
        return True
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    return any(isinstance(i.meta.get("val"), torch.Tensor) for i in node.all_input_nodes)


def strided_like_stored(val: object) -> bool:
    """True when `val` (a node's ``meta["val"]``) has the strides its stored copy will have,
    size-1 dimensions aside (they do not move any element); False for a symbolic stride."""
    if not isinstance(val, torch.Tensor):
        return True
    try:
        want = make_contiguous_strides_for(val.shape)
        return all(int(s) == int(w) for d, s, w in zip(val.shape, val.stride(), want) if int(d) != 1)
    except (TypeError, RuntimeError):  # unbacked symbols
        return False


def _keep_observed_layouts(plan: Plan) -> None:
    """A stored constant has the canonical layout (`folding.core.sizes`): walking back from each kept
    op that observes strides (a random ``_like`` op, ``as_strided``) through what stays, every
    folded value reached that would be stored with other strides (for ``as_strided``, any)
    stays too. Runtime ops between them are assumed to pass layout on (elementwise ops do)."""
    observers = [n for n in plan.candidates[0].graph.nodes if observes_layout(n) and not plan.folded(n)] \
        if plan.candidates else []
    seen: set[torch.fx.Node] = set()
    for observer in observers:
        storage = packet_name(observer.target) in _STORAGE_READERS  # any view between changes what it reads
        work = list(observer.all_input_nodes)
        while work:
            n = work.pop()
            if n in seen or n.op != "call_function":
                continue
            seen.add(n)
            if plan.folded(n):
                if not storage and strided_like_stored(n.meta.get("val")):
                    continue  # its stored copy reads the same
                plan.runtime[n] = (Reason.LAYOUT_OBSERVED, f"{observer.name} observes its strides")
            if storage and op_facts(n.target).aliased_position is None:
                continue  # an op that is not a view makes its own storage: what it reads does not matter
            work.extend(n.all_input_nodes)


def _keep_until_stable(plan: Plan, analysis: Analysis, rule: Callable[[Plan], None]) -> None:
    """`rule`, then `_keep_alias_classes_whole` for what it kept, until neither keeps more: a kept
    node must not leave its in-place class half folded."""
    while True:
        before = len(plan.runtime)
        rule(plan)
        _keep_alias_classes_whole(plan, analysis)
        if len(plan.runtime) == before:
            return


def _storable(val: object) -> bool:
    """What `lift` can store for a runtime reader: a tensor, or a scalar written into it."""
    return isinstance(val, torch.Tensor) or is_scalar(val)


def _keep_unstorable_inputs(plan: Plan) -> None:
    """A value that cannot be stored (the tuple of ``chunk``, ``split``, which ``getitem`` nodes
    read) stays with each reader that is not folded, and so, in turn, does each unstorable value
    it reads."""
    work = list(plan.runtime)
    work += [r for n in plan.candidates if plan.folded(n) and not _storable(n.meta.get("val"))
             for r in n.users if r.op != "output" and not plan.folded(r)]
    while work:
        reader = work.pop()
        for n in reader.all_input_nodes:
            if plan.folded(n) and not _storable(n.meta.get("val")):
                plan.runtime[n] = (Reason.DEPENDS_ON_KEPT,
                                   f"{reader.name} stays and reads its value, which is not a tensor")
                work.append(n)


def _keep_checks_of_runtime_values(plan: Plan, analysis: Analysis) -> None:
    """A check (``_assert_tensor_metadata``) reading a value that stays stays too: a runtime op
    may update that value in place before the check reads it."""
    for n in plan.candidates:
        if analysis.is_check(n) and plan.folded(n):
            kept = next((i for i in n.all_input_nodes if i in plan.runtime), None)
            if kept is not None:
                plan.runtime[n] = (Reason.DEPENDS_ON_KEPT, f"{kept.name}: {plan.runtime[kept][0].name}")


def _finish(plan: Plan, analysis: Analysis) -> None:
    """Derive `evaluated`, `materialise`, `release` and `probed` from `candidates` and `runtime`."""
    needed: set[torch.fx.Node] = set()
    for n in reversed(plan.candidates):
        if plan.folded(n) or any(u in needed for u in n.users):
            needed.add(n)
    plan.probed = {n for n in analysis.kind if n not in needed and is_probed(n)
                   and any(analysis.is_constant(i) for i in n.all_input_nodes)}
    plan.evaluated = ([n for n in analysis.order if n in needed or n in plan.probed] if plan.probed
                      else [n for n in plan.candidates if n in needed])
    plan.materialise = {n for n in plan.evaluated
                        if plan.folded(n) and not analysis.is_check(n) and any(not plan.folded(u) for u in n.users)}
    position = {n: i for i, n in enumerate(plan.evaluated)}
    last_update: dict[torch.fx.Node, int] = {}
    for root, muts in analysis.mutators.items():
        updates = [position[m] for m in muts if m in position]
        if root in position and updates:
            last_update[root] = max(updates)
    for n in plan.evaluated:
        last = max([position[n]] + [position[u] for u in n.users if u in position])
        plan.release[n] = max(last, last_update.get(analysis.class_of(n), -1))
