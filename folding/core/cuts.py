"""Where each constant region is cut: which values are stored, which ops stay at runtime.

A *region* is a connected set of folded ops with the constant placeholders they read; its
*sinks* are the values that nodes staying in the program (or the output) read. A plan for a
region is the set of values it stores: a sink not stored is computed at runtime from its inputs,
recursively. Plans are ranked by runtime ops first (on QNN/HTP a constant-only op may strand a
partition), then stored bytes; growth is stored bytes minus the region's placeholder bytes.

Limits (`FoldPolicy`): no stored value above ``max_tensor_bytes``; total growth within the
budget. Regions of at most `EXACT_LIMIT` ops get their exact Pareto front (ops, growth); larger
ones two plans (fewest ops, and as-is). The budget is met greedily, moving the region whose next
plan saves the most bytes per runtime op added. The as-is plan (growth <= 0) always exists.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx

from ..reasons import Reason
from .sizes import aligned, value_bytes

# Regions with at most this many ops are planned exactly (2**14 subsets, a few ms each).
EXACT_LIMIT = 14


@dataclass(frozen=True)
class RegionPlan:
    stored: frozenset  # ops whose value is stored
    runtime: frozenset  # ops that stay in the program
    stored_bytes: int
    growth: int

    @property
    def runtime_ops(self) -> int:
        return len(self.runtime)


@dataclass
class Region:
    ops: list[torch.fx.Node]  # graph order
    placeholders: list[torch.fx.Node]
    sinks: list[torch.fx.Node]
    pinned: set = field(default_factory=set)  # placeholders read by runtime ops directly
    base_bytes: int = 0
    in_place: bool = False  # holds an in-place alias class: folded whole or left as it is


def node_bytes(node: torch.fx.Node) -> int:
    """Serialized bytes of a node's ``meta["val"]``, padded as the constant segment pads each
    buffer (`sizes.aligned`); 0 when unknown or not one tensor."""
    return aligned(value_bytes(node))


def find_regions(folded: list[torch.fx.Node], is_folded, constant_placeholders: set[torch.fx.Node],
                 placeholder_bytes: dict[torch.fx.Node, int], fixed: set[torch.fx.Node]) -> list[Region]:
    """Connected components of folded ops and constant placeholders (union-find, O(edges))."""
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def find(x):
        root = x
        while parent.setdefault(root, root) is not root:
            root = parent[root]
        while parent[x] is not root:
            parent[x], x = root, parent[x]
        return root

    for n in folded:
        for i in n.all_input_nodes:
            if is_folded(i) or i in constant_placeholders:
                parent[find(n)] = find(i)
    groups: dict[torch.fx.Node, Region] = {}
    for n in folded:
        r = groups.setdefault(find(n), Region([], [], []))
        r.ops.append(n)
        r.in_place = r.in_place or n in fixed
        if any(not is_folded(u) for u in n.users):
            r.sinks.append(n)
    seen: set = set()
    for n in folded:
        for i in n.all_input_nodes:
            if i in constant_placeholders and i not in seen:
                seen.add(i)
                r = groups[find(i)]
                r.placeholders.append(i)
                r.base_bytes += placeholder_bytes.get(i, 0)
                if any(not is_folded(u) for u in i.users):
                    r.pinned.add(i)
    return [r for r in groups.values() if r.sinks]


def evaluate_cut(region: Region, stored: frozenset, sizes: dict, placeholder_bytes: dict,
                 canon: dict) -> RegionPlan:
    """The runtime ops, stored bytes and growth of storing exactly `stored` (restricted to
    values the runtime still needs)."""
    op_set = set(region.ops)
    runtime: set = set()
    kept_ph: set = set(region.pinned)
    used_store: set = set()
    stack = list(region.sinks)
    visited: set = set()
    while stack:
        v = stack.pop()
        if v in visited:
            continue
        visited.add(v)
        if v in stored:
            used_store.add(v)
            continue
        if v in op_set:
            runtime.add(v)
            stack.extend(v.all_input_nodes)
        elif v in placeholder_bytes:
            kept_ph.add(v)
    if region.in_place and runtime:
        # In-place updates are not ancestors of the values they change: such a region is cut whole.
        runtime = op_set
        used_store = set()
        kept_ph = set(region.placeholders)
    stored_bytes = sum(sizes[v] for v in {canon.get(v, v): v for v in used_store}.values())
    stored_bytes += sum(placeholder_bytes.get(p, 0) for p in kept_ph)
    return RegionPlan(frozenset(used_store), frozenset(runtime), stored_bytes, stored_bytes - region.base_bytes)


def pareto_front(region: Region, sizes, placeholder_bytes, canon, storable_nodes: set) -> list[RegionPlan]:
    """Plans not dominated in (runtime ops, growth), fewest runtime ops first."""
    storable = [n for n in region.ops if n in storable_nodes]
    if len(region.ops) <= EXACT_LIMIT and not region.in_place:
        subsets = itertools.chain.from_iterable(itertools.combinations(storable, k) for k in range(len(storable) + 1))
    else:  # fewest ops, and as-is (the only plans of an in-place class, which is cut whole)
        subsets = [storable, ()]
    plans = {evaluate_cut(region, frozenset(s), sizes, placeholder_bytes, canon) for s in subsets}
    front: list[RegionPlan] = []
    for p in sorted(plans, key=lambda p: (p.runtime_ops, p.growth, p.stored_bytes, sorted(n.name for n in p.stored))):
        if not front or p.growth < front[-1].growth:
            front.append(p)
    return front


def choose_cuts(regions: list[Region], sizes, placeholder_bytes, canon, max_tensor_bytes: Optional[int],
                budget: Optional[int], storable: set) -> dict[torch.fx.Node, tuple[Reason, str]]:
    """Pick one plan per region: fewest total runtime ops with total growth within `budget`.

    `storable`: the values that may be stored (a tensor or scalar within the cap); one left
    out for its size is reported as such. Returns the ops that stay with their reason.
    """
    # The fewest-ops plan (store every value that fits, nearest the sinks) is unique; the full
    # fronts of every region are needed only when the budget binds.
    fronts = [[evaluate_cut(r, frozenset(n for n in r.ops if n in storable), sizes, placeholder_bytes, canon)]
              for r in regions]
    choice = [0] * len(regions)
    total = sum(f[0].growth for f in fronts)
    if budget is not None and total > budget:
        fronts = [pareto_front(r, sizes, placeholder_bytes, canon, storable) for r in regions]
        total = sum(f[0].growth for f in fronts)
        heap = []
        for i, f in enumerate(fronts):
            _push_step(heap, i, f, 0)
        while total > budget and heap:
            _, i, k = heapq.heappop(heap)
            if choice[i] != k:
                continue
            total += fronts[i][k + 1].growth - fronts[i][k].growth
            choice[i] = k + 1
            _push_step(heap, i, fronts[i], k + 1)
    runtime: dict[torch.fx.Node, tuple[Reason, str]] = {}
    for r, f, k in zip(regions, fronts, choice):
        plan = f[k]
        for n in plan.runtime:
            if n not in storable and max_tensor_bytes is not None and sizes[n] > max_tensor_bytes:
                runtime[n] = (Reason.MAX_TENSOR_BYTES, f"{sizes[n]:,} bytes > max_tensor_bytes {max_tensor_bytes:,}")
            else:
                runtime[n] = (Reason.GROWTH_BUDGET, f"region of {len(r.ops)} ops: storing it would grow constants "
                              f"by {f[0].growth:,} bytes; chose +{plan.growth:,} bytes with {plan.runtime_ops} "
                              "runtime ops")
    return runtime


def _push_step(heap, i, front, k) -> None:
    if k + 1 < len(front):
        saved = front[k].growth - front[k + 1].growth
        added = front[k + 1].runtime_ops - front[k].runtime_ops
        # Most bytes saved per runtime op added first; ties by region index (deterministic).
        heapq.heappush(heap, (-saved / max(added, 1), i, k))
