"""The stages on hand-built graphs, one at a time: `analyze` -> `make_plan` -> `evaluate`.

Each graph is a few `torch.fx.Graph` nodes with a signature made by `bodies.body_signature`
(which placeholders are constant); values in ``meta["val"]`` are real tensors, so the planner's
byte counts are the tensors' own. What the stages decide is checked against values computed
here with torch directly.
"""

from __future__ import annotations

import pytest
import torch

from folding import FoldPolicy, Reason
from folding.analysis import analyze
from folding.bodies import body_signature
from folding.evaluate import evaluate
from folding.plan import make_plan


def _op(g: torch.fx.Graph, name: str, target, *args) -> torch.fx.Node:
    return g.create_node("call_function", target, args, name=name)


def _graph(w: torch.Tensor, x: torch.Tensor):
    """``y = exp(w * 2) + x`` and a factory ``z = full(shape_of(w), 3) * w`` returned too."""
    g = torch.fx.Graph()
    pw, px = g.placeholder("w"), g.placeholder("x")
    mul = _op(g, "mul", torch.ops.aten.mul.Tensor, pw, 2.0)
    exp = _op(g, "exp", torch.ops.aten.exp.default, mul)
    add = _op(g, "add", torch.ops.aten.add.Tensor, exp, px)
    full = _op(g, "full", torch.ops.aten.full.default, list(w.shape), 3.0)
    z = _op(g, "mul_1", torch.ops.aten.mul.Tensor, full, pw)
    g.output((add, z))
    vals = {pw: w, px: x, mul: w * 2, exp: (w * 2).exp(), add: (w * 2).exp() + x, full: torch.full(w.shape, 3.0),
            z: 3.0 * w}
    for n, v in vals.items():
        n.meta["val"] = v
    signature = body_signature([pw, px], {pw})
    return g, signature, {n.name: n for n in g.nodes}


def _stages(graph, signature, policy, stored):
    analysis = analyze(graph, signature, policy)
    placeholders = {n: stored[n.name].nbytes for n in graph.nodes if n.op == "placeholder" and n.name in stored}
    plan = make_plan(analysis, policy, placeholders, sum(placeholders.values()))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    return analysis, plan, evaluate(plan, analysis, module, lambda n: stored[n.name])


@pytest.mark.parametrize("seed", range(3))
def test_constant_chain_folds_and_only_its_last_value_is_stored(seed):
    g = torch.Generator().manual_seed(seed)
    w, x = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    graph, signature, n = _graph(w, x)
    analysis, plan, evaluation = _stages(graph, signature, FoldPolicy(), {"w": w})
    assert analysis.reason[n["add"]] is Reason.RUNTIME_INPUT
    assert [m.name for m in plan.evaluated] == ["mul", "exp", "full", "mul_1"]
    assert plan.materialise == {n["exp"], n["mul_1"]}  # mul and full are read only by folded nodes
    assert set(evaluation.values) == plan.materialise and evaluation.learnt is None
    torch.testing.assert_close(evaluation.values[n["exp"]], (w * 2).exp())
    torch.testing.assert_close(evaluation.values[n["mul_1"]], torch.full(w.shape, 3.0) * w)
    assert evaluation.evaluated == 4
    # each value is released after its last evaluated reader: mul after exp, full after mul_1
    order = {m: i for i, m in enumerate(plan.evaluated)}
    assert plan.release[n["mul"]] == order[n["exp"]] and plan.release[n["full"]] == order[n["mul_1"]]


def test_values_over_max_tensor_bytes_stay_at_runtime_computed_from_the_stored_weight():
    w, x = torch.randn(4, 8), torch.randn(4, 8)
    graph, signature, n = _graph(w, x)
    cap = w.nbytes - 1  # every value of the chain is as large as w: none may be stored
    analysis, plan, evaluation = _stages(graph, signature, FoldPolicy(max_tensor_bytes=cap), {"w": w})
    stored = [m for m in plan.materialise]
    assert all(m.meta["val"].nbytes <= cap for m in stored)
    kept = {m.name for m in plan.runtime}
    assert {"exp", "mul_1"} <= kept  # both results stay at runtime, computed from the stored w
    assert not evaluation.values or all(v.nbytes <= cap for v in evaluation.values.values())


def test_an_op_that_raises_is_kept_with_the_error_and_its_inputs_are_stored():
    g = torch.fx.Graph()
    pw, px = g.placeholder("w"), g.placeholder("x")
    mul = _op(g, "mul", torch.ops.aten.mul.Tensor, pw, 2.0)
    bad = _op(g, "mm", torch.ops.aten.mm.default, mul, mul)  # 4x8 @ 4x8: the shapes do not match
    g.output((_op(g, "add", torch.ops.aten.add.Tensor, bad, px),))
    w = torch.randn(4, 8)
    for node, v in ((pw, w), (px, torch.randn(4, 4)), (mul, w * 2), (bad, torch.empty(4, 4))):
        node.meta["val"] = v
    for node in g.nodes:
        node.meta.setdefault("val", torch.empty(4, 4))
    analysis, plan, evaluation = _stages(g, body_signature([pw, px], {pw}), FoldPolicy(), {"w": w})
    reason, detail = evaluation.kept[bad]
    assert reason is Reason.EVALUATION_ERROR and detail.startswith("RuntimeError"), detail
    torch.testing.assert_close(evaluation.values[mul], w * 2)  # the kept op reads it as a stored value


def test_a_view_kept_for_its_strides_after_the_size_limits_is_counted_against_the_budget():
    """``rand_like`` observes the strides of ``new_zeros(a)[:, -1]``, so that view stays and
    ``new_zeros`` (64 bytes, not the 32-byte view) is what gets stored; with ``floor(w)``
    stored too (+112 bytes: ``w`` stays for a runtime reader) the growth would be 96 bytes over a
    70-byte budget, so ``floor`` must stay at runtime. The size limits first chose with the view
    stored (64 bytes of growth, within budget) and were not run again (fuzz case 8001662)."""
    g = torch.fx.Graph()
    pa, pw, px = g.placeholder("a"), g.placeholder("w"), g.placeholder("x")
    zeros = _op(g, "new_zeros", torch.ops.aten.new_zeros.default, pa, [5, 3])
    view = _op(g, "select", torch.ops.aten.select.int, zeros, 1, -1)
    noise = _op(g, "rand_like", torch.ops.aten.rand_like.default, view)
    floor = _op(g, "floor", torch.ops.aten.floor.default, pw)
    keep_w = _op(g, "add", torch.ops.aten.add.Tensor, px, pw)
    use = _op(g, "mul", torch.ops.aten.mul.Tensor, keep_w, floor)
    g.output((noise, use))
    a, w, x = torch.randn(20), torch.randn(28), torch.randn(28)
    base = torch.zeros(5, 3)
    for node, v in ((pa, a), (pw, w), (px, x), (zeros, base), (view, base[:, -1]), (noise, torch.rand(5)),
                    (floor, w.floor()), (keep_w, x + w), (use, (x + w) * w.floor())):
        node.meta["val"] = v
    policy = FoldPolicy(max_growth_bytes=70, max_growth_fraction=0.0)
    analysis, plan, evaluation = _stages(g, body_signature([pa, pw, px], {pa, pw}), policy, {"a": a, "w": w})
    assert plan.runtime[view][0] is Reason.LAYOUT_OBSERVED
    assert plan.runtime[floor][0] is Reason.GROWTH_BUDGET
    assert plan.materialise == {zeros}
    torch.testing.assert_close(evaluation.values[zeros], base)
