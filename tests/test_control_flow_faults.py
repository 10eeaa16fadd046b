"""Issue 21, faults 1-3, each as a kind: the caller's program is never rewritten (invariant 7),
bodies and regions without operands fold, and a folded program keeps no dead leftover of the
control flow it folded away. Every program goes through `test_control_flow.fold_and_compare`:
caller snapshot before/after, a second fold giving the same program, no dead leftovers, and
eager outputs (and .pte where executorch emits the op) against the unfolded program on inputs
that take each branch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from folding import FoldPolicy
from tests.fold_checks import call_targets
from tests.control_flow_checks import body_targets, fold_and_compare

X = torch.randn(4)
BOTH = [(X.abs() + 0.1,), (-X.abs() - 0.1,)]  # x.sum() > 0, then not


# Fault 1: operands identical after folding. Lifting stores identical bytes once, so the HOP
# is given one placeholder twice and its bodies must be rebuilt with one operand fewer.

def _same_after_folding(w: torch.Tensor, how: str) -> torch.Tensor:
    return {"mul1": lambda: w * 1.0, "add0": lambda: w + 0.0, "clone": lambda: w.clone()}[how]()


class CondRepeated(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.w, self.how = nn.Parameter(torch.randn(4)), how

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x, a, b: (x + a) * b, lambda x, a, b: (x - a) * b,
                          (x, self.w, _same_after_folding(self.w, self.how)))


@pytest.mark.parametrize("how", ["mul1", "add0", "clone"])
def test_cond_given_a_weight_and_its_identical_copy_leaves_the_caller_running(how):
    ep, result = fold_and_compare(CondRepeated(how), BOTH)
    ep.module()(X)  # the caller's bodies still take three operands


class CondTwoMasks(nn.Module):
    def forward(self, x):
        m1 = (torch.arange(4) % 2 == 0).float()
        m2 = (torch.arange(4) % 2 == 0).float()
        return torch.cond(x.sum() > 0, lambda x, a, b: (x * a + b,), lambda x, a, b: (x * b - a,), (x, m1, m2))


def test_cond_given_two_identical_masks_leaves_the_caller_running():
    ep, _ = fold_and_compare(CondTwoMasks(), BOTH)
    ep.module()(X)


class MapRepeated(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        return hop_map(lambda xi, a, b: (xi + a) * b, xs, self.w, self.w + 0.0)


def test_map_given_a_weight_and_its_identical_copy_leaves_the_caller_running():
    xs = torch.randn(3, 4)
    ep, _ = fold_and_compare(MapRepeated(), [(xs,)])
    ep.module()(xs)


class ScanRepeated(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        a, b = self.w, self.w * 1.0

        def combine(carry, xi):  # a and b become the scan's additional inputs
            y = carry * a + xi * b
            return y, y.clone()

        return scan(combine, torch.zeros(4), xs)


def test_scan_given_a_weight_and_its_identical_copy_leaves_the_caller_running():
    xs = torch.randn(3, 4)
    ep, _ = fold_and_compare(ScanRepeated(), [(xs,)])
    ep.module()(xs)


class NestedUnderConstantPredicate(nn.Module):
    """A runtime cond inside the branch a constant predicate takes: inlining brings the inner
    cond (and the caller's inner bodies) to the top level, with repeated operands."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        def inner(x, a, b):
            return torch.cond(x.sum() > 0, lambda x, a, b: (x + a) * b, lambda x, a, b: (x - a) * b, (x, a, b))

        return torch.cond(self.flag, inner, lambda x, a, b: (x * 0 + a,), (x, self.w, self.w * 1.0))


def test_nested_cond_under_a_constant_predicate_cond_leaves_the_caller_running():
    ep, result = fold_and_compare(NestedUnderConstantPredicate(), BOTH,
                                  one_branch={"cond"})  # the constant predicate (a buffer)
    ep.module()(X)
    assert call_targets(result.program).count("higher_order.cond") == 1  # the inner one, inlined


class NestedRepeated(nn.Module):
    """Repeated operands two levels down: merging the outer bodies' placeholders repeats the
    operands of the inner cond as well."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        def outer_true(x, a, b):
            return torch.cond(x[0] > 0, lambda x, a, b: ((x + a) * b,), lambda x, a, b: ((x - a) * b,), (x, a, b))

        return torch.cond(x.sum() > 0, outer_true, lambda x, a, b: (x * b - a,), (x, self.w, self.w + 0.0))[0]


def test_repeated_operands_of_a_nested_cond_are_merged_at_every_level():
    inputs = BOTH + [(torch.tensor([-1.0, 2.0, 2.0, 2.0]),)]
    ep, _ = fold_and_compare(NestedRepeated(), inputs)
    ep.module()(X)


class AutocastStrict(nn.Module):
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


# Fault 2: bodies and regions with constant code and no operands.

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


class CondWithoutOperands(nn.Module):
    def forward(self, x):
        c = torch.cond(x.sum() > 0, lambda a: (torch.full((4,), -0.5) * 1.0,), lambda a: (torch.ones(4) * 2.0,), (x,))
        return c[0] + x


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


# Fault 3: control flow folded away entirely leaves nothing behind (checked by
# `fold_and_compare` through `invariants.leftovers`).

class ConstantCond(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(False))

    def forward(self, x):
        c = torch.cond(self.flag, lambda w: (w.exp(),), lambda w: (w.cos() * 2,), (self.w,))[0]
        return x + c


class ConstantWhile(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        i, acc = while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc * 0.5 + self.w),
                            (torch.zeros((), dtype=torch.int64), self.w))
        return x + acc


class ConstantMap(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return x + hop_map(lambda wi: wi.exp() * 2, self.w).sum(0)


class ConstantScan(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        def combine(carry, wi):
            y = carry + wi.sin()
            return y, y.clone()

        carry, ys = scan(combine, torch.zeros(4), self.w)
        return x + carry + ys.sum(0)


class ConstantNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        with torch.no_grad():
            c = self.w.exp() * 2
        return x + c


class ConstantAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = self.w @ self.w
        return x + c.float().sum(0)


@pytest.mark.parametrize(
    "make, pte",
    [(ConstantCond, True), (ConstantWhile, True), (ConstantMap, True), (ConstantScan, True),
     (ConstantNoGrad, True), (ConstantAutocast, True)],
    ids=["cond", "while_loop", "map", "scan", "no_grad", "autocast"],
)
def test_control_flow_folded_away_leaves_no_get_attr_submodule_or_tensor(make, pte):
    ep, result = fold_and_compare(make(), BOTH[:1], pte=pte)
    assert not [n for n in result.program.graph.nodes if n.op == "get_attr"]
    assert not list(result.program.graph_module.named_children())
    assert set(result.program.state_dict) | set(result.program.constants) == {
        s.target for s in result.program.graph_signature.input_specs if s.target is not None}


class AutocastMixed(nn.Module):
    """Constant code moved out of an autocast region into a region of its own, which then folds
    whole: that region (``submod_folded``) must not stay attached."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = x @ (self.w @ self.w.t())
        return b.float()


def test_code_moved_out_of_an_autocast_region_leaves_no_region_behind():
    ep, result = fold_and_compare(AutocastMixed(), [(torch.randn(2, 4),)], pte=False)
    children = [name for name, _ in result.program.graph_module.named_children()]
    assert len(children) == 1, children  # the region that reads x


# Siblings found by generating programs: inlining a constant-predicate cond after the first
# fold must not reuse the caller's names (the report names the caller's nodes), nor drop a
# node of the caller that torch.export left unused.

class InlinedNameOfAFoldedNode(nn.Module):
    """`add` (constant, folded in the first fold) and the taken branch's own `add`."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        y = torch.cond(self.flag, lambda x, a: ((x + a) * a,), lambda x, a: (x - a,), (x, self.w))[0]
        return y + ((torch.arange(4) % 2 == 0).float() + self.w * 0)


class UnusedGetitemBesideAConstantCond(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(True))

    def forward(self, x):
        y = torch.cond(self.flag, lambda x, a: (x + a,), lambda x, a: (x - a,), (x, self.w))[0]
        i, acc = while_loop(lambda i, acc: i < 2, lambda i, acc: (i + 1, acc * 0.5), (torch.zeros((), dtype=torch.int64), y))
        return acc  # the loop counter's getitem is left without users by torch.export


@pytest.mark.parametrize("make", [InlinedNameOfAFoldedNode, UnusedGetitemBesideAConstantCond],
                         ids=["folded_name", "unused_getitem"])
def test_inlining_a_constant_cond_keeps_the_callers_names(make):
    ep, result = fold_and_compare(make(), BOTH, pte=False, one_branch={"cond"})
    names = {n.name for n in result.program.graph.nodes}
    folded = {d.node for d in result.report.decisions if d.folded and "/" not in d.node}
    assert not names & folded, names & folded


@pytest.mark.parametrize(
    "make, rows",
    [(lambda: CondRepeated("mul1"), False), (MapRepeated, True), (ScanRepeated, True),
     (NestedUnderConstantPredicate, False), (CondWithoutOperands, False), (ConstantCond, False), (ConstantScan, False)],
    ids=["cond_repeated", "map_repeated", "scan_repeated", "nested_constant_predicate", "cond_no_operands",
         "constant_cond", "constant_scan"],
)
def test_the_same_programs_in_edge_dialect_and_their_pte(make, rows):
    """FoldConstantsPass's position (``to_edge`` output): the same checks (`fold_checked`), and
    the folded program's .pte against the unfolded program on inputs taking each branch."""
    import copy

    from tests.fold_checks import assert_close_all, edge, export
    from tests.invariants import edge_pte, outputs, run_pte
    from tests.control_flow_checks import fold_checked

    inputs = [(torch.randn(3, 4),)] if rows else BOTH
    ep = edge(export(make(), inputs[0]))
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    pte = edge_pte(result.program)  # serialised from a copy: the program stays Edge
    for x in inputs:
        assert_close_all(outputs(ref, x), outputs(result.program, x))
        assert_close_all(outputs(ref, x), run_pte(pte, x), atol=1e-4)


# Kinds the control-flow fuzzer (tests/fuzz/control_flow.py) found, shrunk.
#
# 1. Inlining a cond with a constant predicate ran torch's `Graph.eliminate_dead_code` on the
#    fold's root graph, which also dead-code-eliminates and recompiles, in place, every body a
#    get_attr reads: a region or branch of the caller's with an unused result lost its code.

class _UnusedRegionBesideAConstantCond(nn.Module):
    def __init__(self, region: str):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.region = region

    def forward(self, x):
        if self.region == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                unused = x @ x.t()  # noqa: F841 (dead code of the caller's own region)
        else:
            with torch.no_grad():
                unused = x * 3.0  # noqa: F841
        return torch.cond(self.w.sum() > 0, lambda a: (torch.sigmoid(a - 1.0),), lambda a: (a * 2.0,), (x,))[0]


@pytest.mark.parametrize("region", ["autocast", "no_grad"])
def test_inlining_beside_an_unused_region_leaves_the_callers_bodies_alone(region):
    """`fold_and_compare` snapshots every GraphModule of the caller's program (graph and code)."""
    fold_and_compare(_UnusedRegionBesideAConstantCond(region), [(torch.randn(3, 4),)], pte=False,
                     one_branch={"cond"})


# 2. A tensor attribute of a body (``to_edge`` makes the scalar of ``t * 2.0`` one) always moves
#    out as an operand, so it is lifted whatever the policy: it was stored already, it is not a
#    folded value, and the report marks it `moved` (not held to `max_tensor_bytes`).

class _BodyScalarUnderAConstantPredicate(nn.Module):
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
    a, b = (a if isinstance(a, (tuple, list)) else (a,)), (b if isinstance(b, (tuple, list)) else (b,))
    for u, v in zip(a, b):
        scale = u.abs().max().item()
        assert scale > 1e-3 and (u - v).abs().max().item() <= 1e-5 * scale, (scale, (u - v).abs().max().item())


class RegionOutputWrittenAtRuntime(nn.Module):
    """Constant code in a region (or a map, or a multi-output op) whose output an in-place op of
    runtime values then writes: the call's tuple folds, the ``getitem`` the write aliases stays
    at runtime (fuzz case 26000094, shrunk: ``KeyError`` in `lift`, the tuple had no stored
    value)."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("b", torch.randn(4, 3, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        if self.how == "no_grad":
            with torch.no_grad():
                v = torch.relu(self.b) * 2.0
        elif self.how == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                v = (torch.relu(self.b) * 2.0).float()
        elif self.how == "map":
            v = hop_map(lambda r: r * 2.0, self.b)
        elif self.how == "chunk":
            v = (self.b * 2.0).chunk(2)[0].repeat(2, 1)
        v.add_(x.mean())
        return x + v


@pytest.mark.parametrize("policy", [None, FoldPolicy.unlimited()], ids=["default", "unlimited"])
@pytest.mark.parametrize("how", ["no_grad", "autocast", "map", "chunk"])
def test_a_folded_call_whose_output_a_runtime_op_writes_stays_with_its_getitem(how, policy):
    g = torch.Generator().manual_seed(1)
    fold_and_compare(RegionOutputWrittenAtRuntime(how).eval(), [(torch.randn(4, 3, generator=g) + 1.0,),
                                                                  (torch.randn(4, 3, generator=g) - 1.0,)],
                     policy=policy)


class RegionWrittenByAnInlinedBranch(nn.Module):
    """A constant-only region whose output a runtime value from a constant-predicate cond then
    writes in place (fuzz case 27000333, shrunk): the region is kept at runtime, pinned, and
    folded again; the new region call stood for a glue getitem with no report name (a
    ``Decision`` named None, AttributeError while merging reports)."""

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
def test_a_region_folded_again_after_a_pin_reports_under_its_nodes_paths(region, returned):
    g = torch.Generator().manual_seed(2)
    _, result = fold_and_compare(RegionWrittenByAnInlinedBranch(region, returned).eval(),
                                 [(torch.randn(1, 2, 5, 2, generator=g),)], pte=returned)
    assert all(isinstance(d.node, str) and d.node for d in result.report.decisions), result.report.decisions


def _zero():
    return torch.arange(1, dtype=torch.float32).reshape(()) / 1  # zeros(())'s bytes, computed


class LoopGivenOneStoredTensorTwice(nn.Module):
    """A loop whose carry and another operand fold to identical bytes (fuzz case 29000135,
    shrunk): stored once, the loop received one tensor twice and ``to_edge`` refused it
    ("scan might be aliasing the input or the output!")."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.w = nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        if self.how == "scan carry and closure":
            return scan(lambda c, t: (c * 0.5 + t * _zero(), c * 2.0), torch.zeros(()), x)[0] + x.sum()
        if self.how == "scan carry equal to a parameter":
            return scan(lambda c, t: (c * 0.5 + t * self.w, c * 2.0), self.w * 1.0, x.unsqueeze(-1).expand(4, 4))[0] + x
        return while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 0.5 + _zero() + x.sum()),
                          (torch.zeros((), dtype=torch.int64), torch.zeros(())))[1] + x


@pytest.mark.parametrize("how", ["scan carry and closure", "scan carry equal to a parameter", "while_loop"])
def test_a_loop_given_one_stored_tensor_twice_reads_a_copy(how):
    from tests.lowering import to_edge_program

    g = torch.Generator().manual_seed(3)
    module = LoopGivenOneStoredTensorTwice(how).eval()
    inputs = [(torch.randn(4, generator=g) + 1.0,), (torch.randn(4, generator=g) - 1.0,)]
    # executorch 1.5.1's emitter has no while_loop: that one is checked in Edge only.
    _, result = fold_and_compare(module, inputs, pte=how != "while_loop")
    to_edge_program(result.program)  # torch's alias check runs when to_edge traces it again


class LoopPassedOneBufferTwice(nn.Module):
    """A loop given one stored node twice, as its carry (or mapped input) and as an operand its
    body reads (fuzz case 32000380, shrunk): torch.export passes the buffer in both places. The
    private placeholder meant for a second tensor of the same storage replaced both occurrences,
    and the buffer was left in the program without a reader (and then the copy was copied again
    at each refold). The program's own aliasing stays as it is; ``to_edge`` refuses it folded or
    not, so only the ATen program is checked. (``map`` cannot be given one tensor twice: export
    refuses a mapped input aliasing another operand.)"""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("b", torch.randn(4, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        if self.how == "while_loop":
            return while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * self.b + x),
                              (torch.zeros((), dtype=torch.int64), self.b))[1]
        return scan(lambda c, t: (c + self.b * t, c * 2.0), self.b, x.unsqueeze(-1).expand(4, 4))[0] + x


@pytest.mark.parametrize("policy", [None, FoldPolicy(max_growth_bytes=0, max_growth_fraction=0.0)], ids=["default", "no-growth"])
@pytest.mark.parametrize("how", ["while_loop", "scan"])
def test_a_loop_passed_one_buffer_twice_keeps_it_and_copies_nothing(how, policy):
    g = torch.Generator().manual_seed(4)
    module = LoopPassedOneBufferTwice(how).eval()
    inputs = [(torch.randn(4, generator=g) + 1.0,), (torch.randn(4, generator=g) - 1.0,)]
    ep, result = fold_and_compare(module, inputs, pte=False, policy=policy)
    folded = result.program
    specs = {s.arg.name: s for s in folded.graph_signature.input_specs}
    for p in folded.graph.find_nodes(op="placeholder"):
        assert p.users or specs[p.name].kind.name == "USER_INPUT", f"{p.name} has no reader"
    stored = [s for s in folded.graph_signature.input_specs if s.kind.name != "USER_INPUT"]
    assert len(folded.constants) + len(folded.state_dict) <= len(ep.constants) + len(ep.state_dict) + 1, stored
