"""Which constant nodes are folded away, which stay in the program, which values are stored.

Every constant node the analysis left foldable is a candidate. Some stay in the program as ops
although they read only constants (``Plan.runtime``), each with a reason:

- a copy of a stored constant that only the graph output reads (how a folded program returns
  a constant), and a scalar the graph output returns;
- a dequantize whose result a runtime op would read keeps its encoding (`quant`), and so do
  the float ops between it and that reader;
- a fill shaped like a runtime tensor that only runtime ops read;
- an op whose value is larger than the policy's cap, or whose region would push the program
  past its growth budget, stays so that a smaller value is stored instead (`cuts`);
- a folded value whose strides a kept op observes (`_keep_observed_layouts`), and a value that cannot be
  stored (a multi-output op's tuple) that a kept op reads;
- every member of an in-place alias class of which one member stays, and a check that reads
  a value that stays.

A folded value is *materialised* (stored as a lifted constant) when a node that stays in the
program, or the graph output, reads it. Nodes are *evaluated* at fold time when they are
folded away or a folded node needs their value. A custom op that stays in the program and reads
a constant is *probed*: run once on stand-ins of its inputs, its result dropped, to learn a
write its schema does not declare (`ops.OpFacts.probed`; `evaluate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch.fx

import torch

from .clones import is_clone
from .cuts import choose_cuts, find_regions, node_bytes
from .ops import OpKind, is_probed, may_call_probed, op_facts, packet_name, structural_key
from .policy import FoldPolicy
from .quant import dequantized_values, is_dequantize
from .reasons import Reason
from .torch_internals import make_contiguous_strides_for
from .values import is_scalar

if TYPE_CHECKING:  # the record this stage reads; a stage never calls another (`fold.py` does)
    from .analysis import Analysis


@dataclass
class Plan:
    """Attributes:
    candidates: constant call_function nodes, in graph order (assertion checks included).
    runtime: candidates that stay in the graph, with (reason, detail).
    evaluated: candidates run at fold time, in graph order.
    materialise: folded-away nodes whose value a node left in the graph or the output reads.
    release: per evaluated node, the index in `evaluated` after which its value is no longer
        needed (its last evaluated reader, or the last in-place update of its alias class).
    probed: nodes in `evaluated` that stay in the program: custom ops reading a constant, run
        only to learn their undeclared writes (`ops.OpFacts.probed`).
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


def make_plan(
    analysis: Analysis,
    policy: FoldPolicy,
    placeholder_bytes: dict[torch.fx.Node, int],
    bytes_before: int,
    budget_cut: int = 0,
    cap_exempt: frozenset = frozenset(),
) -> Plan:
    """Plan the fold of every constant node within the policy's size limits.

    Args:
        placeholder_bytes: stored bytes of each constant placeholder (tensors shared by several
            placeholders count for the first only).
        bytes_before: the program's stored constant bytes, for the growth budget.
        budget_cut: bytes taken off the policy's growth budget (after a plan whose measured
            growth exceeded it).
        cap_exempt: names of nodes `max_tensor_bytes` does not apply to: each replaces a stored
            tensor of its own size (`transposed_gathers`: the transpose of a matrix it alone reads).

    A rule that keeps a value at runtime after the size limits chose what to store (a value
    whose strides a kept op observes; an unstorable tuple) makes its folded inputs stored
    values the limits did not count: the limits then run again, with it kept.

    O(nodes + edges) per round (one round when no rule keeps more), plus the exact search of
    small regions when the budget binds.
    """
    candidates = [n for n in analysis.order if n.op == "call_function" and analysis.reason.get(n) is None]
    plan = Plan(candidates)
    _keep_output_copies(plan, analysis)
    _keep_scalar_outputs(plan)
    _keep_encodings(plan, analysis)
    _keep_runtime_shaped_fills(plan, analysis)
    _keep_alias_classes_whole(plan, analysis)
    while True:  # the size limits count what is stored; each rule after them may change it
        _apply_size_limits(plan, analysis, policy, placeholder_bytes, bytes_before, budget_cut, cap_exempt)
        limited = len(plan.runtime)
        if analysis.calls_any(may_observe_layout):
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
    if _limits_cannot_bind(plan, folded, policy.max_tensor_bytes, budget, cap_exempt):
        return
    fixed = {n for n in folded if analysis.class_of(n) is not None}
    constant_placeholders = set(placeholder_bytes)
    regions = find_regions(folded, plan.folded, constant_placeholders, placeholder_bytes, fixed)
    sizes = {n: node_bytes(n) for r in regions for n in r.ops}
    cap = policy.max_tensor_bytes
    storable = {
        n for r in regions for n in r.ops
        if (isinstance(n.meta.get("val", torch.empty(0)), torch.Tensor) or is_scalar(n.meta.get("val")))
        and (cap is None or sizes[n] <= cap or n.name in cap_exempt)
    }  # a scalar "stored" costs 0 bytes: it is inlined into its readers
    runtime = choose_cuts(
        regions, sizes, placeholder_bytes, _identical_values(folded), policy.max_tensor_bytes, budget, storable
    )
    plan.runtime.update(runtime)


def _limits_cannot_bind(plan: Plan, folded, max_tensor_bytes, budget, cap_exempt) -> bool:
    """True when storing every sink (each folded value a kept op or the output reads) respects
    both limits: each within the cap, their sum within the budget. That plan leaves no constant
    op at runtime and grows the program by at most the sinks' bytes (the placeholders it still
    reads were counted before folding), so no region is cut; this O(n) check spares the
    region search on large programs of small constants."""
    total = 0
    for n in folded:
        if not _readers_outside(plan, n):
            continue
        val = n.meta.get("val")
        if is_scalar(val):
            continue  # inlined into its readers: stores nothing
        if not isinstance(val, torch.Tensor):
            return False  # a sink the planner cannot store: let it decide
        size = node_bytes(n)
        if max_tensor_bytes is not None and size > max_tensor_bytes and n.name not in cap_exempt:
            return False
        total += size
    return budget is None or total <= budget


def _identical_values(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, torch.fx.Node]:
    """Map each node to the first node computing the same op on the same inputs (hash-consing):
    their values are equal, and the lift stores them once, so the planner counts them once."""
    canon: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[tuple, torch.fx.Node] = {}
    for n in nodes:
        key = structural_key(n, canon)
        canon[n] = n if key is None else seen.setdefault(key, n)
    return canon


def _readers_outside(plan: Plan, node: torch.fx.Node) -> bool:
    return any(not plan.folded(u) for u in node.users)


def _keep_output_copies(plan: Plan, analysis: Analysis) -> None:
    """A copy of a constant placeholder returned only as an output is how a folded program
    returns a constant (ExecuTorch cannot return a stored buffer): folding it again would only
    insert the same copy under a new name, so folding a folded program changes nothing."""
    if not analysis.calls_any(is_clone):
        return
    for n in plan.candidates:
        if (
            is_clone(n.target)  # what `lift` itself inserts before an output returning a stored constant
            and n.all_input_nodes
            and n.all_input_nodes[0].op == "placeholder"
            and n.users
            and all(u.op == "output" for u in n.users)
        ):
            plan.runtime[n] = (Reason.OUTPUT_COPY, "")


def _keep_scalar_outputs(plan: Plan) -> None:
    """A scalar (``item()`` of a constant) is folded by writing its value into the ops that read
    it; the graph output cannot hold a literal, so a scalar the output returns stays an op."""
    for n in plan.candidates:
        if not isinstance(n.meta.get("val"), torch.Tensor) and any(u.op == "output" for u in n.users):
            if is_scalar(n.meta.get("val")):
                plan.runtime[n] = (Reason.NOT_A_TENSOR, "a scalar returned as an output")


def _keep_encodings(plan: Plan, analysis: Analysis) -> None:
    """Leave in the graph every dequantize (and float op after it) whose value would otherwise be
    stored for a runtime op to read; what is stored instead is the dequantize's integer input.

    The graph output is not such a reader: an encoding is read by the op that consumes the
    dequantize (QNN's AnnotateQuantAttrs/FoldQDQ), and a dequantize the output alone reads
    carries none. Left in, it is constant-only work that HTP refuses to build (``could not
    create op``, executorch issues 17732/18622); folded, the program returns its float value."""
    if not analysis.calls_any(is_dequantize):
        return
    dq = dequantized_values(plan.candidates)
    work = [n for n in plan.candidates if n in dq and any(u.op != "output" and not plan.folded(u) for u in n.users)]
    while work:
        n = work.pop()
        if n in plan.runtime:
            continue
        if is_dequantize(n.target):
            plan.runtime[n] = (Reason.KEEPS_ENCODING, "")
        else:
            plan.runtime[n] = (Reason.AFTER_DEQUANTIZE, "")
        work.extend(i for i in n.all_input_nodes if i in dq and i not in plan.runtime)


def _keep_runtime_shaped_fills(plan: Plan, analysis: Analysis) -> None:
    """Leave in the graph a fill shaped like a runtime tensor (``full_like(x)``,
    ``x.new_zeros(...)``, the zero attention bias that SDPA's decomposition builds) whose value
    only runtime ops read. Storing it costs all its bytes and saves one fill at runtime; kept,
    it reads a runtime input, so it never forms a constant-only partition."""
    if not analysis.calls_any(lambda t: op_facts(t).metadata_only):
        return
    for n in plan.candidates:
        if (
            plan.folded(n)
            and op_facts(n.target).metadata_only
            and n.args
            and isinstance(n.args[0], torch.fx.Node)
            and not analysis.is_constant(n.args[0])
            and analysis.class_of(n) is None
            and n.users
            and not any(plan.folded(u) for u in n.users)
        ):
            plan.runtime[n] = (Reason.FILL_OF_RUNTIME_SHAPE, f"shaped like runtime value {n.args[0].name}")


def _keep_alias_classes_whole(plan: Plan, analysis: Analysis) -> None:
    """A value updated in place and its views (an alias class) fold whole or stay whole: when a
    rule keeps one member at runtime (a dequantize keeping its encoding, whose result a later
    ``narrow(...).fill_()`` overwrites), the in-place updates must run on that runtime value,
    so every member stays."""
    if not analysis.mutators:  # no in-place op: no class
        return
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in plan.candidates:
        root = analysis.class_of(n)
        if root is not None:
            members.setdefault(root, []).append(n)
    for root, cls in members.items():
        cls = ([root] if root in plan._candidate_set and root not in cls else []) + cls
        kept = next((m for m in cls if m in plan.runtime), None)
        if kept is None:
            continue
        for m in cls:
            if m not in plan.runtime:
                plan.runtime[m] = (Reason.DEPENDS_ON_KEPT, f"in-place class of {root.name}: {kept.name} stays")


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
    """A stored constant has the canonical layout (`folding.sizes`), so a folded value with
    other strides changes what a kept op reads when that op observes strides (a random
    ``_like`` op, ``as_strided``). Walking back from each such op through what stays at
    runtime, every folded value it reaches that is stored with other strides than it had (or,
    for ``as_strided``, any folded value) stays too, until the values reached are laid out as
    stored. Runtime ops between them are assumed to pass layout on (elementwise ops do).
    O(nodes + edges) over all observers together."""
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
    """`rule`, then `_keep_alias_classes_whole` for what it kept, until neither keeps more.

    A node a rule keeps at runtime must not leave its in-place class half folded: a view
    updated in place (``conv(w).narrow(...).add_(1)``) kept because a random op reads it would
    otherwise write into its stored base on every call, and a kept ``chunk`` is a view too.
    Each round but the last keeps at least one more node, so the loop ends."""
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
    """A node that stays at runtime reads each folded input as a stored constant; a value that
    cannot be stored (the tuple of a multi-output op such as ``chunk``, ``split``, ``unbind``,
    which its ``getitem`` nodes read) stays at runtime with its reader, and so, in turn, does
    each unstorable value it reads. Any rule that keeps a ``getitem`` needs this: when a runtime
    op observes the strides of ``chunk(buffer)[0]``, the ``getitem`` stays, and its ``chunk``
    must stay with it, since `lift` has no tensor to store for a tuple. The readers are every
    node that is not folded: those the plan keeps, and those the analysis keeps (a ``getitem``
    of a control-flow call's tuple that an in-place op of runtime values writes into). Size
    limits need it not (`cuts` stores only storable values). O(nodes + edges)."""
    work = list(plan.runtime)
    work += [r for n in plan.candidates if plan.folded(n) and not _storable(n.meta.get("val"))
             for r in n.users if r.op != "output" and not plan.folded(r)]
    while work:
        reader = work.pop()
        for n in reader.all_input_nodes:
            if plan.folded(n) and not _storable(n.meta.get("val")):
                plan.runtime[n] = (Reason.DEPENDS_ON_KEPT, f"{reader.name} stays and reads its value, which is not a tensor")
                work.append(n)


def _keep_checks_of_runtime_values(plan: Plan, analysis: Analysis) -> None:
    """A check (``_assert_tensor_metadata`` …) is evaluated at fold time only when every value it
    reads is folded: a value that stays at runtime may be updated in place by a runtime op
    before the check reads it, so the check stays with it."""
    if not analysis.calls_any(lambda t: op_facts(t).kind is OpKind.ASSERTION):
        return
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
    if analysis.calls_any(may_call_probed):
        plan.probed = {n for n in analysis.kind if n not in needed and is_probed(n)
                       and any(analysis.is_constant(i) for i in n.all_input_nodes)}
    plan.evaluated = ([n for n in analysis.order if n in needed or n in plan.probed] if plan.probed
                      else [n for n in plan.candidates if n in needed])
    plan.materialise = {
        n for n in plan.evaluated if plan.folded(n) and not analysis.is_check(n) and _readers_outside(plan, n)
    }
    position = {n: i for i, n in enumerate(plan.evaluated)}
    last_update: dict[torch.fx.Node, int] = {}
    for root, muts in analysis.mutators.items():
        updates = [position[m] for m in muts if m in position]
        if root in position and updates:
            last_update[root] = max(updates)
    for n in plan.evaluated:
        last = position[n]
        for u in n.users:
            if u in position and position[u] > last:
                last = position[u]
        root = analysis.class_of(n)
        if root is not None and root in last_update:
            last = max(last, last_update[root])
        plan.release[n] = last
