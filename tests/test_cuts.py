"""`folding.core.cuts` on hand-built region graphs: the Pareto front against exhaustive enumeration,
and what a cut keeps at runtime. The program-wide budget (`choose_cuts`) is the plan's, in
test_plan.py.

Each graph is a random DAG of a few constant ops over constant placeholders
(`tests/programs.regions`); some ops are read by a runtime op (the region's sinks). Node sizes
are drawn, not derived from tensors: the cuts only read the sizes they are given. Nothing here
is executed.
"""

from __future__ import annotations

from hypothesis import given, settings

from folding.core.cuts import pareto_front
from tests.programs import every_plan, regions


@settings(max_examples=150, deadline=None)
@given(regions())
def test_pareto_front_is_exactly_the_non_dominated_plans(case):
    found, sizes, placeholder_bytes, storable = case
    for region in found:
        front = pareto_front(region, sizes, placeholder_bytes, {}, storable)
        every = every_plan(region, sizes, placeholder_bytes, storable)
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
        for plan in every_plan(region, sizes, placeholder_bytes, storable):
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
