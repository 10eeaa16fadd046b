"""Control flow (issue 12): constant code inside cond/while_loop/map/scan/autocast bodies folds,
a cond with a constant predicate is inlined, and the folded program computes what the
unfolded one does, in eager and as a .pte (portable runtime; executorch 1.5.1 emits cond, map
and scan, not while_loop)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import folding
from folding import FoldPolicy, Reason
from folding.core.analysis import _node_reason
from tests.work import calls
from tests.control_flow_checks import body_targets, fold_and_compare, fold_checked
from tests.fold_checks import call_targets, decision, export
from tests.invariants import assert_close_all, assert_same_outputs
from tests.invariants import outputs
from tests.programs import (CondRepeated, CondWithoutOperands, ConstantCond, ConstantScan, MapRepeated,
                            NestedUnderConstantPredicate, OneCond, ScanRepeated)

KEPT_WHOLE = ("aten.linear.default", "aten.rms_norm.default", "aten.scatter.src", "aten.matmul.default")


def folded_paths(report) -> set[str]:
    return {d.node for d in report.decisions if "/" in d.node and d.folded}


class BranchConstants(nn.Module):
    """Both branches hold constant-only kept-whole ops (linear, rms_norm, scatter)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.g = nn.Parameter(torch.rand(8) + 0.5)
        self.register_buffer("idx", torch.randint(0, 8, (2, 8)))

    def forward(self, x):
        def true_fn(x, w, g, idx):
            return (x @ F.linear(w, w) + F.rms_norm(w, (8,), g).sum(0),)

        def false_fn(x, w, g, idx):
            return (x + torch.zeros(8, 8).scatter(0, idx, w)[0],)

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x, self.w, self.g, self.idx))[0]


def test_constant_kept_whole_ops_inside_both_branches_fold_and_both_branches_run():
    x = torch.randn(3, 8)
    ep, result = fold_and_compare(BranchConstants(), [(x.abs(),), (-x.abs(),)])
    assert not set(body_targets(result.program)) & set(KEPT_WHOLE[:3]), body_targets(result.program)
    paths = folded_paths(result.report)
    for path in ("cond.true_graph_0/linear", "cond.true_graph_0/rms_norm", "cond.false_graph_0/scatter"):
        assert path in paths, paths
    assert "higher_order.cond" in call_targets(result.program)  # the predicate reads x
    # The parameters only the moved code read are no longer operands, so no longer stored.
    assert "p_g" in result.report.removed_placeholders


class ConstantPredicate(nn.Module):
    def __init__(self, flag: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.register_buffer("flag", torch.tensor(flag))

    def forward(self, x):
        def true_fn(x, w):
            return (x @ F.linear(w, w),)

        def false_fn(x, w):
            return (x - w.sum(),)

        return torch.cond(self.flag, true_fn, false_fn, (x, self.w))[0]


@pytest.mark.parametrize("flag", [True, False])
def test_cond_with_a_constant_predicate_is_replaced_by_its_taken_branch(flag):
    ep, result = fold_and_compare(ConstantPredicate(flag), [(torch.randn(3, 8),)])
    assert "higher_order.cond" not in call_targets(result.program)
    assert decision(result.report, "cond").reason is Reason.INLINED
    taken, untaken = ("true_graph_0", "false_graph_0") if flag else ("false_graph_0", "true_graph_0")
    folded_op = "linear" if flag else "sum_1"
    assert decision(result.report, f"cond.{taken}/{folded_op}").reason is Reason.FOLDED
    assert all(d.reason is Reason.BRANCH_NOT_TAKEN for d in result.report.decisions if f"cond.{untaken}/" in d.node)
    assert not list(result.program.graph_module.named_children())  # no body left


class PredicateFromConstants(nn.Module):
    """The predicate is computed from a weight; after inlining, the taken branch's constant
    code folds across the old branch boundary."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        def true_fn(x, w):
            return (x * w.exp().sum(0),)

        def false_fn(x, w):
            return (x * w.cos().sum(0),)

        return torch.cond(self.w.mean() > -10, true_fn, false_fn, (x, self.w))[0] + 1


def test_predicate_computed_from_constants_is_inlined_then_folded():
    ep, result = fold_and_compare(PredicateFromConstants(), [(torch.randn(3, 8),)])
    assert call_targets(result.program) == ["aten.mul.Tensor", "aten.add.Tensor"]


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)

    def forward(self, x):
        def inner_true(x, w):
            return (x @ F.linear(w, w),)

        def inner_false(x, w):
            return (x + 1,)

        def outer_true(x, w):
            return (torch.cond(x[0].sum() > 0, inner_true, inner_false, (x, w))[0],)

        def outer_false(x, w):
            return (x @ w.t(),)

        return torch.cond(x.sum() > 0, outer_true, outer_false, (x, self.w))[0]


def test_constant_code_of_a_nested_cond_climbs_both_levels():
    x = torch.randn(3, 8)
    inputs = [(x.abs(),), (-x.abs(),), (torch.cat([-x.abs()[:1], 10 * x.abs()[1:]]),)]
    ep, result = fold_and_compare(Nested(), inputs)
    assert "aten.linear.default" not in body_targets(result.program)
    assert "cond.true_graph_0/cond.true_graph_0/linear" in folded_paths(result.report)
    assert "cond.false_graph_0/t" in folded_paths(result.report)


class LoopWithTable(nn.Module):
    """A while_loop whose body reads a constant-only table (additional input)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        def cond_fn(i, acc):
            return i < 4

        def body_fn(i, acc):
            return i + 1, acc + torch.sin(self.table * 2).sum(0) * i

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))[1]


def test_while_loop_body_reads_its_table_folded():
    # executorch 1.5.1's emitter has no while_loop: eager only.
    ep, result = fold_and_compare(LoopWithTable(), [(torch.randn(3, 8),)], pte=False)
    paths = folded_paths(result.report)
    assert any(p.endswith("/sin") for p in paths), paths
    assert "aten.sin.default" not in body_targets(result.program)
    carried = [d for d in result.report.decisions if d.node.endswith("/mul_1")]
    assert carried and carried[0].reason is Reason.RUNTIME_INPUT  # * i: reads the carry


class ConstantLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 8)

    def forward(self, x):
        def cond_fn(i, acc):
            return i < 3

        def body_fn(i, acc):
            return i + 1, acc @ self.w + 1

        return x @ while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), self.w))[1]


def test_while_loop_on_constants_is_evaluated_and_the_program_lowers():
    ep, result = fold_and_compare(ConstantLoop(), [(torch.randn(3, 8),)])
    assert "higher_order.while_loop" not in call_targets(result.program)


class MapAndScan(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)
        self.b = nn.Parameter(torch.randn(8))

    def forward(self, x):
        def body(xi, w, b):
            return xi @ F.linear(w, w) + b.tanh()

        mapped = hop_map(body, x, self.w, self.b)

        def combine(carry, xi):
            y = carry * 0.5 + xi @ (self.w * 2).t()
            return y, y.clone()

        carry, ys = scan(combine, torch.zeros(8), mapped)
        return carry, ys


def test_map_and_scan_bodies_fold_their_weight_transforms():
    x = torch.randn(5, 8)
    ep, result = fold_and_compare(MapAndScan(), [(x,), (x * 3,)])
    paths = folded_paths(result.report)
    for suffix in ("/linear", "/tanh", "/t"):
        assert any(p.startswith(("map_impl.", "scan.")) and p.endswith(suffix) for p in paths), (suffix, paths)
    assert "aten.linear.default" not in body_targets(result.program)


class AutocastRegion(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.dtype = dtype

    def forward(self, x):
        with torch.autocast("cpu", dtype=self.dtype):
            a = self.w @ self.w.t()
            b = x @ a
        return b.float()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_region_constant_matmul_is_bit_exact(dtype):
    module = AutocastRegion(dtype)
    x = torch.randn(3, 8)
    ep = export(module, (x,))
    result = fold_checked(ep)
    got = outputs(result.program, (x,))[0]
    with torch.autocast("cpu", dtype=dtype):
        want = module(x)
    assert torch.equal(got, want.float())
    lifted = [c for c in result.report.lifted if c.dtype == str(dtype).replace("torch.", "")]
    assert lifted and lifted[0].shape == (8, 8)  # the matmul's value, stored in the region's dtype


class NamesLikeOps(nn.Module):
    """Inputs named like nodes (``mul``, ``t_1``) and a body that gains placeholders."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, mul, t_1):
        def true_fn(a, b, w):
            return (a * 2 + b @ w.t() * 3,)

        def false_fn(a, b, w):
            return (a - b * w.t().sum(),)

        return torch.cond(mul.sum() > 0, true_fn, false_fn, (mul, t_1, self.w))[0] + self.w.t()


def test_names_stay_unique_in_every_graph_after_moving_code_out():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    ep, result = fold_and_compare(NamesLikeOps(), [(x.abs(), y), (-x.abs(), y)])
    for m in result.program.graph_module.modules():
        if isinstance(m, torch.fx.GraphModule):
            names = [n.name for n in m.graph.nodes]
            assert len(names) == len(set(names)), names
    assert [n.name for n in result.program.graph.nodes if n.op == "placeholder"][-2:] == ["mul", "t_1"]


class QuantizedBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 4)

    def forward(self, x):
        qd = torch.ops.quantized_decomposed

        def true_fn(x, w):
            q = qd.quantize_per_tensor.default(w * 2, 0.02, 0, -128, 127, torch.int8)
            return (x @ qd.dequantize_per_tensor.default(q, 0.02, 0, -128, 127, torch.int8),)

        def false_fn(x, w):
            return (x + 1,)

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x, self.w))[0]


def test_quantized_branch_keeps_its_dequantize_and_stores_integers():
    import executorch.kernels.quantized  # noqa: F401  (the out variants the .pte calls)
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    module = QuantizedBranch()
    x = torch.randn(3, 8)
    ep, result = fold_and_compare(module, [(x.abs(),), (-x.abs(),)])
    assert "quantized_decomposed.dequantize_per_tensor.default" in body_targets(result.program)
    assert "quantized_decomposed.quantize_per_tensor.default" not in body_targets(result.program)
    int8 = [c for c in result.report.lifted if c.dtype == "int8"]
    assert len(int8) == 1
    stored = result.program.constants[int8[0].target]
    qd = torch.ops.quantized_decomposed
    assert torch.equal(stored, qd.quantize_per_tensor.default(module.w.detach() * 2, 0.02, 0, -128, 127, torch.int8))
    kept = decision(result.report, "cond.true_graph_0/dequantize_per_tensor")
    assert kept.reason is Reason.KEEPS_ENCODING


def test_size_limit_keeps_moved_code_in_its_body():
    policy = FoldPolicy(max_tensor_bytes=100)  # linear(w, w) is 256 bytes
    ep, result = fold_and_compare(ConstantPredicate(True).train(False), [(torch.randn(3, 8),)], policy=policy)
    x = torch.randn(3, 8).abs()
    ep, result = fold_and_compare(BranchConstants(), [(x,), (-x,)], policy=policy)
    d = decision(result.report, "cond.true_graph_0/linear")
    assert d.reason is Reason.MAX_TENSOR_BYTES
    assert "aten.linear.default" in body_targets(result.program)  # where it ran before


def test_an_op_that_raises_in_an_untaken_branch_stays_in_that_branch():
    class Raises(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("bad", torch.tensor([7]))  # out of range for w's 4 rows

        def forward(self, x):
            def true_fn(x, w, bad):
                return (x + w.index_select(0, bad).sum(),)

            def false_fn(x, w, bad):
                return (x - w.sum(),)

            return torch.cond(x.sum() > 0, true_fn, false_fn, (x, self.w, self.bad))[0]

    # The true branch raises at runtime too: only the false one can run.
    ep, result = fold_and_compare(Raises(), [(-torch.rand(2, 4),)], one_branch={"cond"})
    d = decision(result.report, "cond.true_graph_0/index_select")
    assert d.reason is Reason.EVALUATION_ERROR
    assert "aten.index_select.default" in body_targets(result.program)


def test_work_grows_linearly_with_the_number_of_bodies():
    """Analysis visits (top-level graph and every body, op nodes `analysis._node_reason` classifies, counted by `tests.work.calls`) per
    control-flow call stay flat from 4 to 16 calls: no body is re-analysed per other body."""

    class Many(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            for _ in range(self.k):
                x = torch.cond(x.sum() > 0, lambda x, w: (x @ w.t(),), lambda x, w: (x - w.exp(),), (x, self.w))[0]
            return x

    per_call = []
    for k in (4, 16):
        program = export(Many(k), (torch.randn(4, 4),))
        with calls(analysis_nodes=_node_reason) as work:
            timings = folding.fold_constants(program).report.timings
        assert work["analysis_nodes"] > 0 and "reruns" not in timings, (work, timings)
        per_call.append(work["analysis_nodes"] / k)
    assert per_call[1] <= per_call[0] * 1.25, per_call


@settings(max_examples=12, deadline=None)
@given(
    ops=st.lists(st.sampled_from(["exp", "t", "mul2", "linear", "sum0", "neg"]), min_size=1, max_size=5),
    which=st.sampled_from(["cond", "map"]),
    sign=st.sampled_from([1.0, -1.0]),
)
def test_random_constant_chains_in_bodies_fold_to_the_same_values(ops, which, sign):
    """A seeded generator of bodies: a chain of ops on the weight, then one runtime op."""

    def chain(w):
        for op in ops:
            w = {"exp": lambda v: v.exp() / 4, "t": lambda v: v.t(), "mul2": lambda v: v * 2,
                 "linear": lambda v: F.linear(v, v) / 4, "sum0": lambda v: v.sum(0, keepdim=True).expand(4, 4),
                 "neg": lambda v: -v}[op](w)
        return w

    class Generated(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4) / 2)

        def forward(self, x):
            if which == "cond":
                return torch.cond(x.sum() > 0, lambda x, w: (x @ chain(w),), lambda x, w: (x - chain(w),), (x, self.w))[0]
            return hop_map(lambda xi, w: xi @ chain(w), x, self.w)

    x = torch.rand(4, 4) * sign
    ep, result = fold_and_compare(Generated(), [(x,), (-x,)], pte=False)
    assert not [t for t in body_targets(result.program) if t in ("aten.exp.default", "aten.linear.default", "aten.neg.default")]


@pytest.mark.parametrize(
    "make, inputs",
    [
        (BranchConstants, (torch.randn(3, 8).abs(),)),
        (lambda: ConstantPredicate(True), (torch.randn(3, 8),)),
        (MapAndScan, (torch.randn(5, 8),)),
    ],
    ids=["cond", "constant_predicate", "map_scan"],
)
def test_edge_dialect_programs_fold_their_bodies_and_their_pte_matches(make, inputs):
    """The same in Edge dialect (``to_edge`` output, FoldConstantsPass's position): bodies hold
    Edge ops, and ``to_edge`` lifts a scan body's scalar into a tensor attribute, which moves out
    as an operand and is counted in the stored bytes (checked against the .pte by `fold`)."""
    from tests.fold_checks import assert_edge_pte_matches, edge

    module = make()
    ep = edge(export(module, inputs))
    result = fold_checked(ep)
    want = module(*inputs)
    assert_edge_pte_matches(result.program, inputs, list(want) if isinstance(want, tuple) else [want])
    assert not constant_only_branch_ops(result.program), "a constant-only op stayed in a branch"


def constant_only_branch_ops(ep) -> list[str]:
    """Ops in the branches of `ep`'s top-level conds that read no runtime value: every input a
    branch placeholder fed by a stored constant, or another such op (factories included)."""
    stored = {s.arg.name for s in ep.graph_signature.input_specs
              if s.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")}
    found = []
    for cond in ep.graph.find_nodes(op="call_function", target=torch.ops.higher_order.cond):
        operands = cond.args[3]
        for attr in cond.args[1:3]:
            body = getattr(ep.graph_module, attr.target)
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            constant = {p for p, o in zip(placeholders, operands) if o.name in stored}
            for n in body.graph.nodes:
                if n.op == "call_function" and all(i in constant for i in n.all_input_nodes):
                    constant.add(n)
                    found.append(f"{attr.target}/{n.name}")
    return found


_X = torch.randn(4)
_BOTH = [(_X.abs() + 0.1,), (-_X.abs() - 0.1,)]  # x.sum() > 0, then not


@pytest.mark.parametrize(
    "make, rows",
    [(lambda: CondRepeated("mul1"), False), (MapRepeated, True), (ScanRepeated, True),
     (NestedUnderConstantPredicate, False), (CondWithoutOperands, False), (ConstantCond, False), (ConstantScan, False)],
    ids=["cond_repeated", "map_repeated", "scan_repeated", "nested_constant_predicate", "cond_no_operands",
         "constant_cond", "constant_scan"],
)
def test_the_same_programs_in_edge_dialect_and_their_pte(make, rows):
    """FoldConstantsPass's position (``to_edge`` output): the programs of tests/test_operands.py
    (repeated operands), tests/test_bodies.py (a body without operands) and
    tests/test_leftovers.py (control flow folded away), with the same checks (`fold_checked`),
    and the folded program's .pte against the unfolded program on inputs taking each branch."""
    import copy

    from tests.fold_checks import edge
    from tests.invariants import edge_pte, run_pte

    inputs = [(torch.randn(3, 4),)] if rows else _BOTH
    ep = edge(export(make(), inputs[0]))
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    pte = edge_pte(result.program)  # serialised from a copy: the program stays Edge
    for x in inputs:
        assert_close_all(outputs(ref, x), outputs(result.program, x))
        assert_close_all(outputs(ref, x), run_pte(pte, x), atol=1e-4)


UPSTREAM = ["FTCondBasic", "FTCondDynShape", "FTCondDeadCode", "FTMapBasic", "FTMapDynShape"]


@pytest.mark.parametrize("dialect", ["ATEN", "EDGE"])
@pytest.mark.parametrize("name", UPSTREAM)
def test_executorch_control_flow_test_models_fold_and_run(name, dialect):
    """executorch's own control-flow test models (exir/tests/control_flow_models.py: cond and
    map, static and dynamic shapes, dead code in branches): programs nobody here wrote."""
    import copy

    from executorch.exir.tests import control_flow_models

    from tests.fold_checks import edge, edge_pte
    from tests.invariants import lower_pte, run_pte

    module = getattr(control_flow_models, name)()
    inputs = module.get_random_inputs()
    shapes = module.get_dynamic_shapes() if hasattr(module, "get_dynamic_shapes") else None
    ep = export(module, inputs, dynamic_shapes=shapes)
    program = ep if dialect == "ATEN" else edge(copy.deepcopy(ep))
    result = fold_checked(program)
    want = module(*inputs)
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    assert_close_all(want, outputs(result.program, inputs))
    pte = lower_pte(result.program) if dialect == "ATEN" else edge_pte(result.program)
    assert_close_all(want, run_pte(pte, inputs), atol=1e-4)
    assert [d for d in result.report.decisions if "/" in d.node], "body nodes have decisions"


@pytest.mark.parametrize("runtime", [True, False], ids=["runtime_predicate", "constant_predicate"])
def test_one_cond_folds_without_a_discarded_attempt(runtime):
    """Each round of the fold (one, and one more after a constant ``cond`` is inlined) is one
    attempt (no time counted as ``reruns``): code inlined from a branch is reported under its
    body path but has no body to go back to (`folding.core.node_meta`)."""
    program = export(OneCond(runtime), (torch.randn(4, 4),))
    result = folding.fold_constants(program)
    assert "reruns" not in result.report.timings, result.report.timings
    assert result.report.folded
    for x in (torch.randn(4, 4), -torch.rand(4, 4) - 1, torch.rand(4, 4) + 1):
        assert_same_outputs(program, result.program, (x,))
