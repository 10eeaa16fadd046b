"""Constant code of control-flow bodies and regions moves out to the graph that calls them, and
folds there (`folding/control_flow/bodies.py`, `Hoisting`).

A ``cond`` branch, a ``no_grad`` or autocast region, or a region nested in a branch, folds its
constant code even when it reads no operand; the code moves out of a copy of the caller's body,
whose own region is never rewritten (invariant 7); a tensor attribute of a body moved out as an
operand is reported as moved, not as a folded value; and a region kept at runtime
reports each decision under its nodes' paths. Every program goes through
`control_flow_checks.fold_and_compare` (caller unchanged, refold, no dead leftovers, eager and
.pte against the unfolded program on inputs taking each branch). Found by issue 21 (fault 2)
and the control-flow fuzzer."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from folding import FoldPolicy
from tests.control_flow_checks import body_targets, fold_and_compare, fold_checked
from tests.programs import CondWithoutOperands
from tests.invariants import assert_close_all

X = torch.randn(4)
BOTH = [(X.abs() + 0.1,), (-X.abs() - 0.1,)]  # x.sum() > 0, then not


class AutocastStrict(nn.Module):
    """An autocast region of the caller's whose constant code (``w @ w.t()``, and ``w * 1.0``,
    which holds ``w``'s bytes) moves out: the folded program calls a new region, and the
    caller's region still takes its operands."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = self.w @ self.w.t()
            b = x @ a + x @ (self.w * 1.0)
        return b.float()


@pytest.mark.parametrize("policy", [FoldPolicy(), FoldPolicy.strict()], ids=["default", "strict"])
def test_autocast_region_of_the_caller_is_not_rewritten(policy):
    x = torch.randn(2, 16)
    ep, _ = fold_and_compare(AutocastStrict(), [(x,)], pte=False, policy=policy)
    ep.module()(x)


# Bodies and regions with constant code and no operands.

class NoGradConstants(nn.Module):
    def forward(self, x):
        with torch.no_grad():
            c = torch.ones(4) * 2.0
        return (x + c,)


class AutocastConstants(nn.Module):
    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = torch.ones(4, 4) @ torch.full((4, 4), 0.5)
        return (x + c.float(),)


class NoGradInsideABranch(nn.Module):
    def forward(self, x):
        def true_fn(x):
            with torch.no_grad():
                c = torch.ones(4) * 3.0
            return (x + c,)

        return torch.cond(x.sum() > 0, true_fn, lambda x: (x - 1.0,), (x,))[0]


@pytest.mark.parametrize("make", [NoGradConstants, AutocastConstants, CondWithoutOperands, NoGradInsideABranch],
                         ids=["no_grad", "autocast", "cond", "no_grad_in_branch"])
def test_a_body_with_constant_code_and_no_operands_folds(make):
    ep, result = fold_and_compare(make(), BOTH, pte=False)
    constant_code = {"aten.mul.Tensor", "aten.ones.default", "aten.full.default", "aten.matmul.default"}
    assert not constant_code & set(body_targets(result.program)), body_targets(result.program)


# What moved out is reported as moved.

class _BodyScalarUnderAConstantPredicate(nn.Module):
    """A tensor attribute of a body (``to_edge`` makes the scalar of ``t * 2.0`` one) always
    moves out as an operand, so it is lifted whatever the policy: it was stored already, it is
    not a folded value, and the report marks it `moved` (not held to `max_tensor_bytes`). Found
    by the control-flow fuzzer (``edge: policy-max-tensor-bytes``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(1, 3, 1))
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return torch.cond(self.b.sum() > 0, lambda a: (a * 2.0 - 1.0,), lambda a: (a + a,), (self.w,))[0] + x


def test_a_body_attribute_moved_out_is_reported_as_moved_not_folded():
    from tests.fold_checks import edge, export
    from tests.invariants import graph_module_attributes
    from tests.control_flow_checks import fold_checked

    strict = FoldPolicy(max_tensor_bytes=0, max_growth_bytes=0, max_growth_fraction=0.0)
    ep = edge(export(_BodyScalarUnderAConstantPredicate(), (torch.randn(3, 4),)))
    body_tensors = [t for m in ep.graph_module.modules() if m is not ep.graph_module
                    for t in graph_module_attributes(m).values() if isinstance(t, torch.Tensor)]
    assert body_tensors  # what to_edge puts in the body
    result = fold_checked(ep, strict)
    assert result.report.lifted and all(c.moved and not c.reused for c in result.report.lifted), result.report.lifted
    assert result.report.constant_bytes_after == result.report.constant_bytes_before
    assert not [d for d in result.report.decisions if d.folded]
    x = torch.randn(3, 4)
    with torch.no_grad():  # the unfolded Edge body holds a plain tensor: torch's cond autograd refuses it
        assert_close(ep.module()(x), result.program.module()(x))


def assert_close(a, b):
    assert_close_all(a, b, 1e-5, 0.0, relative=True, min_scale=1e-3)


class RegionWrittenByAnInlinedBranch(nn.Module):
    """A constant-only region whose output a runtime value from a constant-predicate cond then
    writes in place (fuzz case 27000333, shrunk): the region is kept at runtime and folded
    again; the new region call stood for a glue getitem with no report name (a ``Decision``
    named None, AttributeError while merging reports)."""

    def __init__(self, region: str, returned: bool):
        super().__init__()
        self.region, self.returned = region, returned
        g = torch.Generator().manual_seed(0)
        self.register_buffer("b", torch.randn(1, 2, 5, 1, generator=g))
        self.w = nn.Parameter(torch.randn(2, 1, generator=g))

    def forward(self, x):
        context = torch.autocast("cpu", dtype=torch.bfloat16) if self.region == "autocast" else torch.no_grad()
        with context:
            v = torch.nn.functional.linear(self.b * 2.0 + 2.0, self.w.tanh()).float()
        r = torch.cond(self.w.mean() < 0, lambda a: (a + 1.5,), lambda a: (a.sigmoid(),), (x,))[0]
        v.sub_(r)
        return (x * 2.0, v) if self.returned else (x * 2.0,)


@pytest.mark.parametrize("returned", [False, True], ids=["dead", "returned"])
@pytest.mark.parametrize("region", ["autocast", "no_grad"])
def test_a_region_kept_at_runtime_reports_under_its_nodes_paths(region, returned):
    g = torch.Generator().manual_seed(2)
    _, result = fold_and_compare(RegionWrittenByAnInlinedBranch(region, returned).eval(),
                                 [(torch.randn(1, 2, 5, 2, generator=g),)], pte=returned)
    assert all(isinstance(d.node, str) and d.node for d in result.report.decisions), result.report.decisions


# Constant code of two branches that differs only in what Python calls equal moves out as two values.

class SiblingBranches(nn.Module):
    """``cond`` whose branches compute ``expr(w, a)`` and ``expr(w, b)``: the same code on two
    scalars that compare equal in Python (``0.0 == -0.0``, ``1 == 1.0 == True``) but that
    torch tells apart."""

    def __init__(self, a, b, expr: str):
        super().__init__()
        self.a, self.b, self.expr = a, b, expr
        self.w = nn.Parameter(torch.rand(4) + 0.5)

    def _branch(self, s):
        w = self.w
        if self.expr == "reciprocal":  # the sign of a zero decides the sign of the infinity
            return lambda x: x + 1 / (w * s)
        if self.expr == "nan_to_num":
            return lambda x: x + torch.nan_to_num(w * s, nan=2.0, posinf=3.0, neginf=-3.0)
        if self.expr == "imaginary_reciprocal":
            return lambda x: x + w + 1 / torch.view_as_real(torch.full((4,), s))[..., 1]
        if self.expr == "full_dtype":  # the scalar's Python type decides the dtype
            return lambda x: x + w * torch.full((4,), s).element_size() + (torch.full((4,), s) * 2**62 * 4).double().float()
        raise ValueError(self.expr)

    def forward(self, x):
        return torch.cond(x.sum() > 0, self._branch(self.a), self._branch(self.b), (x,))


@pytest.mark.parametrize("a, b, expr", [
    (0.0, -0.0, "reciprocal"),  # issue 52's fault 2: branch B returned +inf
    (-0.0, 0.0, "reciprocal"),
    (complex(1.0, 0.0), complex(1.0, -0.0), "imaginary_reciprocal"),
    (float("inf"), float("-inf"), "reciprocal"),
    (float("nan"), float("nan"), "nan_to_num"),  # the same bits: one value (export drops a NaN's sign)
    (2, 2.0, "full_dtype"), (True, 1, "full_dtype"), (1.0, True, "full_dtype"),
], ids=["zero", "negative_zero", "complex_zero", "inf", "nan", "int_float", "bool_int", "float_bool"])
def test_branches_differing_only_in_what_python_calls_equal_keep_their_values(a, b, expr):
    fold_and_compare(SiblingBranches(a, b, expr), BOTH, pte=False)


# A body shared by two control-flow slots (the second fresh review of issue 52, fault 5).
# torch.export gives each call its own bodies, but a pass that deduplicates submodules may not,
# and executorch's `to_edge` accepts such a program (it traces each call anew). The fold copies
# every body slot gets a body of its own (`bodies._Hoist.own_bodies`); before, the second
# call kept its old operands and the folded program raised ``forward() missing 1 required
# positional argument``, or, where the count of operands stayed the same (``two_regions``),
# read the first call's moved constant: wrong numbers.

def _sin(x, w):
    return (x + torch.sin(w),)


def _cos(x, w):
    return (x - torch.cos(w) * 2.0,)


class _TwoWeights(nn.Module):
    """Two seeded (4,) buffers ``w`` and ``v``, one per control-flow call of the programs below."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randn(4, generator=g))
        self.register_buffer("v", torch.randn(4, generator=g))


class TwoConds(_TwoWeights):
    """Two ``cond`` nodes on different weights; `_share` makes ``cond_1`` call ``cond``'s bodies."""

    def forward(self, x):
        a = torch.cond(x.sum() > 0, _sin, _cos, (x, self.w))[0]
        return torch.cond(x.mean() > 0.5, _sin, _cos, (a, self.v))[0]


class TwoLoops(_TwoWeights):
    """Two ``while_loop`` nodes whose bodies read a weight each (an additional input)."""

    def forward(self, x):
        def loop(x, w):
            return while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + torch.sin(w) * 2.0),
                              (torch.zeros((), dtype=torch.int64), x))[1]

        return loop(loop(x, self.w), self.v)


class CondAndMap(_TwoWeights):
    """A ``cond`` and a ``map_impl`` whose bodies take the same operands; `_share` makes the map
    call the cond's true branch."""

    def forward(self, x, xs):
        a = torch.cond(x.sum() > 0, _sin, _cos, (x, self.w))[0]
        return a, hop_map(_sin, xs, self.v)[0]


class Nested(_TwoWeights):
    """Two conds inside a cond's true branch (shared with each other), and the outer branches."""

    def forward(self, x):
        def outer(x, w, v):
            a = torch.cond(x.sum() > 0, _sin, _cos, (x, w))[0]
            return (torch.cond(x.mean() > 0.5, _sin, _cos, (a, v))[0],)

        return torch.cond(x.max() > 0, outer, lambda x, w, v: (x * torch.tanh(v),), (x, self.w, self.v))[0]


def _share(gm, hop: str, position: int, source: str, source_position: int) -> None:
    """Make `gm`'s node `hop` call, at argument `position`, the body node `source` calls at
    `source_position` (the same ``get_attr`` node); the body it called before is deleted."""
    nodes = {n.name: n for n in gm.graph.nodes}
    args = list(nodes[hop].args)
    args[position] = nodes[source].args[source_position]
    nodes[hop].args = tuple(args)
    for n in list(gm.graph.nodes):
        if n.op == "get_attr" and not n.users:
            gm.graph.erase_node(n)
            delattr(gm, n.target)  # not `delete_all_unused_submodules`: it deletes nested bodies
    gm.recompile()


class TwoRegions(_TwoWeights):
    """Two ``no_grad`` regions (``wrap_with_set_grad_enabled``) on different weights; `_share`
    makes the second call the first's body."""

    def forward(self, x):
        with torch.no_grad():
            a = x + torch.sin(self.w)
        a = a * 2.0
        with torch.no_grad():
            b = a + torch.sin(self.v)
        return b


class OuterTwice(_TwoWeights):
    """Two conds whose true branch holds a cond of its own; `_share` makes ``cond_1`` call
    ``cond``'s bodies, nested cond included."""

    def forward(self, x):
        def outer(x, w, v):
            return (torch.cond(x.mean() > 0.5, _sin, _cos, (x, w))[0] * torch.tanh(v),)

        def other(x, w, v):
            return (x * torch.tanh(v) + w,)

        a = torch.cond(x.max() > 0, outer, other, (x, self.w, self.v))[0]
        return torch.cond(x.min() < 0, outer, other, (a, self.v, self.w))[0]


X4 = [(torch.tensor([1.0, 2.0, 0.5, -0.2]),), (torch.tensor([0.2, 0.1, 0.3, 0.2]),),
      (torch.tensor([-1.0, -2.0, 0.5, -0.2]),), (torch.tensor([-0.1, 0.1, 0.0, -0.3]),),
      (torch.tensor([2.0, 1.0, 3.0, 0.5]),), (torch.tensor([-1.0, -2.0, -0.5, -0.2]),)]
XS = [(x, torch.randn(3, 4, generator=torch.Generator().manual_seed(i))) for i, (x,) in enumerate(X4)]
BOTH_BODIES = [("cond_1", 1, "cond", 1), ("cond_1", 2, "cond", 2)]
SHARED = {  # case -> (module, what it shares, in which graph, inputs taking each branch)
    "two_conds": (TwoConds, BOTH_BODIES, "", X4),
    "one_body_twice": (TwoConds, [("cond", 2, "cond", 1)], "", X4),
    "two_loops": (TwoLoops, [("while_loop_1", 0, "while_loop", 0), ("while_loop_1", 1, "while_loop", 1)], "", X4),
    "cond_and_map": (CondAndMap, [("map_impl", 0, "cond", 1)], "", XS),
    "nested_inner": (Nested, BOTH_BODIES, "true_graph_0", X4),
    "nested_outer": (OuterTwice, BOTH_BODIES, "", X4),
    "two_regions": (TwoRegions, [("add_1", 1, "add", 1)], "", X4),
}


@pytest.mark.parametrize("case", sorted(SHARED))
@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
def test_a_body_shared_by_two_calls_is_folded_for_each(case, inplace):
    from folding import fold_constants
    from tests.control_flow_checks import assert_each_branch_taken, fold_checked
    from tests.fold_checks import reference
    from tests.invariants import outputs
    from tests.lowering import lower_pte, run_pte

    make, shares, inside, inputs_list = SHARED[case]
    ep = torch.export.export(make(), inputs_list[0])
    for share in shares:
        _share(ep.graph_module.get_submodule(inside), *share)
    ref = reference(ep)
    assert_each_branch_taken(ref, inputs_list)
    expected = [outputs(ref, inputs) for inputs in inputs_list]
    result = fold_constants(ep, inplace=True) if inplace else fold_checked(ep)
    assert result.report.folded, "nothing moved out: the program does not test the rule"
    for inputs, want in zip(inputs_list, expected):
        assert_close_all(want, outputs(result.program, inputs))
        assert_close_all(want, outputs(ep, inputs))  # the caller's program runs (replaced when inplace)
    if case in ("two_conds", "nested_outer", "two_regions") and not inplace:  # executorch's emitter has no while_loop or map
        buffer = lower_pte(result.program)  # once: each run of the .pte on one input
        for inputs, want in zip(inputs_list, expected):
            assert_close_all(want, run_pte(buffer, inputs), 1e-4, 1e-4)


def test_a_call_passing_fewer_operands_than_its_body_takes_is_a_fold_invariant_error():
    """The net under the rule above (`checks.check_body_arity`, run on every folded program):
    a body rewritten for one call and called by another fails the fold, naming the call."""
    from folding import FoldInvariantError
    from folding.core.checks import check_folded

    ep = torch.export.export(TwoConds(), X4[0])
    body = ep.graph_module.true_graph_0
    with body.graph.inserting_after(next(iter(body.graph.nodes))):
        body.graph.placeholder("extra")
    body.recompile()
    with pytest.raises(FoldInvariantError, match="cond passes 2 operands to its body 'true_graph_0', which takes 3"):
        check_folded(ep)


# Tensors written in place are never merged (the constant code of a body moved out node by node).

_SOURCES = {  # a fresh tensor a body makes from the weight `w`, or from nothing
    "clone": lambda w: w.clone(),
    "zeros": lambda w: torch.zeros(4),
    "full": lambda w: torch.full((4,), 3.0),
    "ones_like": lambda w: torch.ones_like(w),
}
_WRITES = {  # an in-place write of constants only (so the written tensor is constant code)
    "add_": lambda t, w: t.add_(1.0),
    "mul_": lambda t, w: t.mul_(2.0),
    "fill_": lambda t, w: t.fill_(5.0),
    "index_put_": lambda t, w: t.index_put_((torch.tensor([1, 2]),), torch.tensor(7.0)),
    "copy_": lambda t, w: t.copy_(w * 4.0),
}
_PAIRS = [(s, k) for s in _SOURCES for k in _WRITES]


def _other(write: str) -> str:
    return "add_" if write == "mul_" else "mul_"


def _written(source: str, write: str, w):
    t = _SOURCES[source](w)
    _WRITES[write](t, w)
    return t


# torch.export refuses, in a scan body, a write of a value read from the weight into a factory tensor.
_SCAN_PAIRS = [(s, k) for s, k in _PAIRS if not (s in ("zeros", "full") and k == "copy_")]


def _written_pairs(w, x, first=True, second=True, pairs=_PAIRS):
    """One output per (source, write): ``a`` from the source, written by the write, and ``b``,
    the same source written otherwise. One node per op and inputs merged ``a`` and ``b``: both
    writes then reach the one tensor."""
    return tuple(x + (_written(s, k, w) if first else 0.0) + (10.0 * _written(s, _other(k), w) if second else 0.0)
                 for s, k in pairs)


class WrittenCopies(nn.Module):
    """`_written_pairs` at the top level or in a body: ``no_grad`` (``wrap_with_set_grad_enabled``),
    autocast, a ``cond`` (``a`` in one branch, ``b`` in the other), ``while_loop``, ``map`` and
    ``scan``."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where
        self.w = nn.Parameter(torch.arange(4.0) + 3.0)

    def forward(self, x):
        w = self.w
        if self.where == "top":
            return _written_pairs(w, x)
        if self.where == "no_grad":
            with torch.no_grad():
                return _written_pairs(w, x)
        if self.where == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return _written_pairs(w, x)
        if self.where == "cond":
            return torch.cond(x.sum() > 0, lambda x, w: _written_pairs(w, x, second=False),
                              lambda x, w: _written_pairs(w, x, first=False), (x, w))
        xs = torch.stack([x, x * 2.0])
        if self.where == "while_loop":
            def body(i, *accs):
                return (i + 1,) + tuple(a + v for a, v in zip(accs, _written_pairs(self.w, x)))

            start = tuple(x * float(k) for k in range(len(_PAIRS)))
            return while_loop(lambda i, *accs: i < 3, body, (torch.zeros((), dtype=torch.int64),) + start)[1:]
        if self.where == "map":
            return hop_map(lambda xi, w: _written_pairs(w, xi), xs, w)
        if self.where == "scan":
            def combine(carry, xi):
                ys = _written_pairs(self.w, carry + xi, pairs=_SCAN_PAIRS)
                return ys[0], tuple(y.clone() for y in ys)

            return scan(combine, torch.zeros(4), xs)[1]
        raise ValueError(self.where)


WHERE = ["top", "no_grad", "autocast", "cond", "while_loop", "map", "scan"]
# Lowered to a .pte where the unfolded program lowers: executorch 1.5.1 emits no while_loop, and
# its functionalization refuses the in-place writes of a map or scan body.
LOWERS = {"top", "no_grad", "autocast", "cond"}


@pytest.mark.parametrize("where", WHERE)
def test_tensors_written_in_place_are_never_merged(where):
    """Each of the two copies keeps its own writes, in eager over three calls and in the .pte
    (before: moved out of a body as one node, the tensor took both writes: ``w.clone()``
    written by ``add_(1)`` and ``mul_(2)`` gave 17 for 11)."""
    from tests.fold_checks import assert_same_over_calls
    from tests.invariants import outputs
    from tests.lowering import lower_pte, run_pte

    inputs = [(torch.tensor([0.5, 1.5, 2.5, 3.5]),), (torch.tensor([-0.5, -1.5, -2.5, -3.5]),)]
    ep = torch.export.export(WrittenCopies(where).eval(), inputs[0])
    result = fold_checked(ep)
    assert result.report.folded, "nothing folded: the program does not test the rule"
    for x in inputs:
        assert_same_over_calls(ep, result.program, x)
    if where in LOWERS:
        buffer = lower_pte(result.program)
        for x in inputs:
            want = outputs(ep, x)
            for _ in range(3):
                assert_close_all(want, run_pte(buffer, x), 1e-5, 0.0, relative=True)


class RaisesInALoopThatDoesNotRun(nn.Module):
    """A ``while_loop`` body whose constant code raises when evaluated (an index out of range):
    it moves out, raises at fold time, is kept, and goes back into the loop body
    (`bodies.sink_kept_code`), so a call whose loop runs no iteration does not raise; a
    constant op beside it still folds."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("bad", torch.tensor([9]))

    def forward(self, x, n):
        def body(i, acc):
            return i + 1, acc + self.w.exp() + self.w.index_select(0, self.bad).sum()

        return while_loop(lambda i, acc: i < n.sum(), body, (torch.zeros((), dtype=torch.int64), x))[1]


def test_an_op_that_raises_in_a_loop_body_goes_back_into_it():
    from folding import Reason
    from tests.fold_checks import decision

    x, none = torch.randn(4), torch.zeros(1, dtype=torch.int64)
    ep = torch.export.export(RaisesInALoopThatDoesNotRun(), (x, none))
    result = fold_checked(ep)
    assert decision(result.report, "while_loop.while_loop_body_graph_0/index_select").reason is Reason.EVALUATION_ERROR
    assert decision(result.report, "while_loop.while_loop_body_graph_0/exp").folded
    assert "aten.index_select.default" in body_targets(result.program)
    assert_close(ep.module()(x, none), result.program.module()(x, none))
    with pytest.raises(Exception):  # a loop that runs raises, folded as unfolded
        result.program.module()(x, torch.ones(1, dtype=torch.int64))
