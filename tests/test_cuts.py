"""`folding.cuts` on hand-built region graphs: the Pareto front against exhaustive enumeration,
and the program-wide budget.

Each graph is a random DAG of a few constant ops over constant placeholders; some ops are read
by a runtime op (the region's sinks). Node sizes are drawn, not derived from tensors: the cuts
only read the sizes they are given. Nothing here is executed.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folding import Reason
from folding.cuts import choose_cuts, evaluate_cut, find_regions, pareto_front

ADD = torch.ops.aten.add.Tensor


def _region_graph(draw_ops: list[tuple[int, int]], sinks: set[int], n_placeholders: int, read_at_runtime: set[int]):
    """Placeholders ``w0..``, then op i reading the two earlier nodes ``draw_ops[i]`` (indices
    into placeholders + earlier ops), then a runtime ``add(op, x)`` for each op in `sinks` and
    an ``add(w, x)`` for each placeholder in `read_at_runtime` (it stays, whatever is stored)."""
    g = torch.fx.Graph()
    ws = [g.placeholder(f"w{i}") for i in range(n_placeholders)]
    x = g.placeholder("x")
    nodes = list(ws)
    ops = []
    for i, (a, b) in enumerate(draw_ops):
        op = g.create_node("call_function", ADD, (nodes[a % len(nodes)], nodes[b % len(nodes)]), name=f"op{i}")
        nodes.append(op)
        ops.append(op)
    outs = [g.create_node("call_function", ADD, (ops[i], x), name=f"run{i}") for i in sorted(sinks)]
    outs += [g.create_node("call_function", ADD, (ws[i], x), name=f"read_w{i}") for i in sorted(read_at_runtime)]
    g.output(tuple(outs))
    return g, ws, ops


@st.composite
def regions(draw):
    n_placeholders = draw(st.integers(1, 2))
    n_ops = draw(st.integers(1, 7))
    draw_ops = [(draw(st.integers(0, n_placeholders + i - 1)), draw(st.integers(0, n_placeholders + i - 1)))
                for i in range(n_ops)]
    sinks = set(draw(st.sets(st.integers(0, n_ops - 1), min_size=1)))
    sinks.add(n_ops - 1)
    read_at_runtime = draw(st.sets(st.integers(0, n_placeholders - 1)))
    g, ws, ops = _region_graph(draw_ops, sinks, n_placeholders, read_at_runtime)
    sizes = {op: 16 * draw(st.integers(0, 8)) for op in ops}
    placeholder_bytes = {w: 16 * draw(st.integers(1, 8)) for w in ws}
    storable = {op for op in ops if draw(st.booleans()) or op.name == f"op{n_ops - 1}"}
    folded = set(ops)
    found = find_regions(ops, folded.__contains__, set(ws), placeholder_bytes, fixed=set())
    return found, sizes, placeholder_bytes, storable


def _every_plan(region, sizes, placeholder_bytes, storable):
    candidates = [n for n in region.ops if n in storable]
    return [evaluate_cut(region, frozenset(s), sizes, placeholder_bytes, {})
            for k in range(len(candidates) + 1) for s in itertools.combinations(candidates, k)]


@settings(max_examples=150, deadline=None)
@given(regions())
def test_pareto_front_is_exactly_the_non_dominated_plans(case):
    found, sizes, placeholder_bytes, storable = case
    for region in found:
        front = pareto_front(region, sizes, placeholder_bytes, {}, storable)
        every = _every_plan(region, sizes, placeholder_bytes, storable)
        # fewest runtime ops first, each step buys strictly less growth
        assert [p.runtime_ops for p in front] == sorted({p.runtime_ops for p in front})
        assert all(a.growth > b.growth for a, b in zip(front, front[1:]))
        for p in front:  # each point is a real plan, and nothing beats it on both counts
            assert p in every
            assert not any(q.runtime_ops <= p.runtime_ops and q.growth < p.growth for q in every)
        for q in every:  # every plan is matched or beaten by a point of the front
            assert any(p.runtime_ops <= q.runtime_ops and p.growth <= q.growth for p in front)


@settings(max_examples=150, deadline=None)
@given(regions())
def test_a_plan_keeps_exactly_what_its_sinks_need_at_runtime(case):
    found, sizes, placeholder_bytes, storable = case
    for region in found:
        for plan in _every_plan(region, sizes, placeholder_bytes, storable):
            # an op runs iff a sink reaches it through ops whose values are not stored
            reach, stack = set(), [s for s in region.sinks if s not in plan.stored]
            while stack:
                v = stack.pop()
                if v in reach or v not in region.ops:
                    continue
                reach.add(v)
                stack.extend(i for i in v.all_input_nodes if i not in plan.stored)
            assert plan.runtime == reach
            read = {i for v in reach for i in v.all_input_nodes if i in placeholder_bytes}
            read |= {w for w in region.placeholders if any(u.name.startswith("read_") for u in w.users)}
            assert plan.stored_bytes == sum(sizes[v] for v in plan.stored) + sum(placeholder_bytes[p] for p in read)
            assert plan.growth == plan.stored_bytes - region.base_bytes


@settings(max_examples=100, deadline=None)
@given(st.lists(regions(), min_size=1, max_size=3), st.integers(-64, 256))
def test_choose_cuts_meets_any_budget_the_regions_can_meet(cases, budget):
    all_regions, sizes, placeholder_bytes, storable = [], {}, {}, set()
    for found, s, p, st_ in cases:  # distinct graphs: the regions are disjoint
        all_regions += found
        sizes.update(s)
        placeholder_bytes.update(p)
        storable |= st_
    runtime = choose_cuts(all_regions, sizes, placeholder_bytes, {}, None, budget, storable)
    unbounded = choose_cuts(all_regions, sizes, placeholder_bytes, {}, None, None, storable)
    growth = 0
    for region in all_regions:
        stored = frozenset(n for n in region.ops if n in storable and n not in runtime)
        plan = evaluate_cut(region, stored, sizes, placeholder_bytes, {})
        assert plan.runtime <= set(runtime)  # what runs is what the cuts report
        growth += plan.growth
    least = sum(min(p.growth for p in _every_plan(r, sizes, placeholder_bytes, storable)) for r in all_regions)
    if least <= budget:
        assert growth <= budget
    assert len(unbounded) <= len(runtime)  # a budget never buys fewer runtime ops
    assert all(reason is Reason.GROWTH_BUDGET for reason, _ in runtime.values())
