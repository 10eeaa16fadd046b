"""Issue 21, faults 4-6, each as a kind.

4. Folding never makes a program that lowered fail to lower: a body returns each constant
   through a copy of its own (HOP outputs may alias neither an operand nor each other), and a
   stored tensor returned as an output while a delegated op reads it is returned through a
   placeholder of its own. Every program here lowers unfolded (the premise, checked), then
   folded through each path (`fold_constants` on the ATen program, `FoldConstantsPass` as a
   transform pass on the Edge program), for the portable runtime and XNNPACK; each .pte runs
   and matches eager on inputs taking each branch.
5. A non-persistent buffer read by several ``chunk`` nodes (timm's rotary embedding) folds.
6. A value whose shape has a free symbol is never evaluated, and the report says why.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.map import map as hop_map

from folding import FoldConstantsPass, FoldPolicy
from tests.fold_checks import assert_close_all, edge, export
from tests.invariants import outputs, run_pte
from tests.control_flow_checks import assert_each_branch_taken, fold_checked

POLICIES = [FoldPolicy(), FoldPolicy.strict()]


def _lower(ep, backend: str, transform_passes=()) -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    partitioner = None
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    manager = to_edge_transform_and_lower(ep, transform_passes=list(transform_passes), partitioner=partitioner)
    return manager.to_executorch().buffer


def assert_lowers_folded_as_unfolded(module: nn.Module, inputs_list, *, backends=("portable", "xnnpack"),
                                     policy=None, one_branch=frozenset()):
    """The premise (the unfolded program lowers for each backend), then the folded program
    through both paths: each .pte matches the unfolded program's eager outputs on every input."""
    ep = export(module.eval(), inputs_list[0])
    assert_each_branch_taken(ep, inputs_list, one_branch)
    ref = copy.deepcopy(ep)
    expected = [outputs(ref, x) for x in inputs_list]
    folded = fold_checked(ep, policy).program
    for backend in backends:
        _lower(copy.deepcopy(ep), backend)  # premise: lowers without folding
        for name, buffer in [
            ("fold_constants", _lower(folded, backend)),
            ("FoldConstantsPass", _lower(copy.deepcopy(ep), backend, [FoldConstantsPass(policy)])),
        ]:
            for x, want in zip(inputs_list, expected):
                assert_close_all(want, run_pte(buffer, x), atol=1e-4), (backend, name)
    return folded


# Fault 4a: a body returning one constant twice.

class BranchReturnsAConstantTwice(nn.Module):
    """The issue's program: one branch returns two copies of one constant."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, a):
        def true_fn(a):
            c = self.w * 0.5
            return c.clone(), c.clone()

        return torch.cond(a.sum() > 0, true_fn, lambda a: (a.mean(0), a.sum(0)), (a,))


class BranchReturnsTwoEqualConstants(nn.Module):
    """Two different constants of identical bytes: stored once, so one operand twice."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, a):
        return torch.cond(a.sum() > 0, lambda a: (self.w * 2.0, self.w + self.w, a.sum(0)),
                          lambda a: (a.mean(0), a.sum(0), a.amax(0)), (a,))


class MapReturnsAConstantTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        def body(xi):
            c = self.w.exp()
            return xi + 1.0, c.clone(), c.clone()

        return hop_map(body, xs)


ROWS = torch.randn(3, 4)
BRANCHES = [(ROWS.abs() + 0.1,), (-ROWS.abs() - 0.1,)]


@pytest.mark.parametrize("policy", POLICIES, ids=["default", "strict"])
@pytest.mark.parametrize("make", [BranchReturnsAConstantTwice, BranchReturnsTwoEqualConstants],
                         ids=["one_constant_twice", "two_equal_constants"])
def test_a_branch_returning_a_constant_twice_still_lowers_and_runs(make, policy):
    assert_lowers_folded_as_unfolded(make(), BRANCHES, policy=policy)


def test_a_map_body_returning_a_constant_twice_still_goes_to_edge():
    """executorch 1.5.1 emits no map with several outputs, so the check stops at `to_edge`
    (where functionalization checks the body's aliasing), with eager outputs compared."""
    ep = export(MapReturnsAConstantTwice(), (ROWS,))
    ref = copy.deepcopy(ep)
    edge(copy.deepcopy(ep))  # premise
    folded = edge(fold_checked(ep).program)
    assert_close_all(outputs(ref, (ROWS,)), outputs(folded, (ROWS,)))


def test_a_branch_of_an_edge_program_returning_a_constant_twice_gets_two_copies():
    """In Edge dialect, folded directly (the copies are the dialect's own clone op)."""
    from tests.invariants import edge_pte

    ep = edge(export(BranchReturnsAConstantTwice(), BRANCHES[0]))
    ref = copy.deepcopy(ep)
    folded = fold_checked(ep).program
    pte = edge_pte(folded)
    for x in BRANCHES:
        with torch.no_grad():  # to_edge lifted the body's scalar into a real tensor: no autograd trace
            want = outputs(ref, x)
        assert_close_all(want, run_pte(pte, x), atol=1e-4)


# Fault 4b: a stored tensor returned as an output while a delegated op reads it.

class LinearBiasReturned(nn.Module):
    """The issue's program: the weight is computed from constants, the bias is returned."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.p = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.b + self.b, self.p), self.p


class ConvWeightReturned(nn.Module):
    """XNNPACK's conv1d reshapes its weight in place: a copy of the shared placeholder would
    return 4-D data."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x):
        return F.conv1d(x, self.w, self.b * 2.0), self.w


class LinearBiasReturnedAsItsEqual(nn.Module):
    """A folded value with the bias's bytes is stored as the bias itself, then returned."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.p = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.b + self.b, self.p), self.p * 1.0, self.p


class BufferReturnedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(6, 2))
        self.register_buffer("b", torch.randn(6))

    def forward(self, x):
        return F.linear(x, self.w, self.b.exp()), self.w, self.w


@pytest.mark.parametrize("policy", POLICIES, ids=["default", "strict"])
@pytest.mark.parametrize(
    "make, x",
    [(LinearBiasReturned, torch.randn(2, 2)), (ConvWeightReturned, torch.randn(1, 3, 8)),
     (LinearBiasReturnedAsItsEqual, torch.randn(2, 2)), (BufferReturnedTwice, torch.randn(2, 2))],
    ids=["linear_bias", "conv1d_weight", "stored_as_its_equal", "buffer_twice"],
)
def test_a_returned_parameter_read_by_a_folded_op_still_lowers_with_xnnpack(make, x, policy):
    assert_lowers_folded_as_unfolded(make(), [(x,)], policy=policy)



class WrittenBufferReturned(nn.Module):
    """A buffer the program writes is returned as written, never as a stored copy."""

    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.randn(6, 2))
        self.register_buffer("p", torch.zeros(6))

    def forward(self, x):
        y = F.linear(x, self.b + self.b, self.p)
        self.p.add_(1.0)
        return y, self.p


def test_a_returned_buffer_the_program_writes_is_returned_as_written():
    x = torch.randn(2, 2)
    ep = export(WrittenBufferReturned(), (x,))
    ref = copy.deepcopy(ep)
    folded = fold_checked(ep).program
    ref_module, folded_module = ref.module(), folded.module()
    for _ in range(2):  # the second call reads the written buffer
        assert_close_all(list(ref_module(x)), list(folded_module(x)))

# Fault 5: a multi-output op of a constant whose getitem stays at runtime.

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """timm's ``rot`` (timm/layers/pos_embed_sincos.py)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def _sin_cos(emb: torch.Tensor, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    half = emb.shape[-1] // 2
    return {
        "chunk": lambda: emb.chunk(2, -1),
        "split": lambda: emb.split(half, -1),
        "unbind": lambda: emb.unflatten(-1, (2, half)).unbind(-2),
        "tensor_split": lambda: emb.tensor_split(2, -1),
    }[how]()


class RotaryAttention(nn.Module):
    """timm ``eva02``'s attention with ``RotaryEmbeddingCat``: a non-persistent buffer of
    sin/cos, split in two by each of the q and k rotations (two multi-output nodes of one
    buffer), read by an op that observes strides (``scaled_dot_product_attention`` carries
    ``nondeterministic_seeded`` for its dropout; ``dropout(training=True)``, ``randn_like``), and
    used elsewhere too."""

    def __init__(self, how: str, reader: str):
        super().__init__()
        t = torch.arange(5.0)[:, None] * torch.arange(1, 5.0).repeat_interleave(2)[None]
        self.register_buffer("pos_embed", torch.cat([t.sin(), t.cos()], -1), persistent=False)
        self.qkv = nn.Linear(8, 24)
        self.how, self.reader = how, reader

    def _rotate(self, x):
        sin, cos = _sin_cos(self.pos_embed, self.how)
        return x * cos + _rotate_half(x) * sin

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, 1, 8)).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self._rotate(q), self._rotate(k)
        if self.reader == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v)
        elif self.reader == "dropout":
            y = q @ k.transpose(-1, -2) + F.dropout(q, 0.5, training=True).sum() * 0
        else:
            y = q @ k.transpose(-1, -2) + torch.randn_like(k).sum() * 0
        return y + self.pos_embed.sum(), self.pos_embed * x.mean()


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("reader", ["sdpa", "dropout", "randn_like"])
@pytest.mark.parametrize("how", ["chunk", "split", "unbind", "tensor_split"])
def test_a_buffer_split_by_two_multi_output_ops_for_a_stride_observer_folds(how, reader, dialect):
    """The multi-output node stays at runtime with its kept ``getitem`` (its tuple cannot be
    stored), with a reason; the rest folds. In Edge the split is ``split_with_sizes_copy``,
    whose pieces are contiguous, so nothing observes a layout and it folds."""
    x = torch.randn(1, 5, 8)
    ep = export(RotaryAttention(how, reader).eval(), (x,))
    if dialect == "edge":
        if reader == "randn_like":
            pytest.skip("randn_like is not an Edge op (to_edge rejects it)")
        ep = edge(ep)
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))
    kept_tuples = [d for d in result.report.decisions if not d.folded and "not a tensor" in d.detail]
    assert all(d.reason.name == "DEPENDS_ON_KEPT" for d in kept_tuples), kept_tuples
    observed = {"sdpa": 2, "dropout": 1, "randn_like": 1}[reader]  # the rotations the reader sees
    assert len(kept_tuples) == (observed if dialect == "aten" else 0), kept_tuples

def test_the_rotary_program_lowers_and_runs_after_folding():
    x = torch.randn(1, 5, 8)
    assert_lowers_folded_as_unfolded(RotaryAttention("chunk", "sdpa"), [(x,)])


# Fault 6: dynamic shapes. A value whose shape has a free symbol is never evaluated.

B = torch.export.Dim("b", min=2, max=8)


class IssueProgram(nn.Module):
    """The issue's program: no constants; its Edge decomposition fills a slice of the input
    (``full_like``)."""

    def forward(self, x):
        t = (x - 0.5).unsqueeze(3).flatten(2) + 0.0
        t[:, :, 0].fill_(0.25)
        return F.log_softmax(torch.split(t, 1, 1)[2], dim=1).triu(0)


def test_the_issue_program_with_a_dynamic_batch_folds_in_edge_dialect():
    """executorch's ``to_edge`` specialises this program's batch to 2 (its range constraints
    become ``{2: [2, 2]}``) but keeps SymInt objects of value 2 in the metadata: those are
    sizes, not free symbols, and evaluation passes them to kernels as ints."""
    x = torch.randn(2, 3, 3)
    ep = edge(export(IssueProgram(), (x,), dynamic_shapes=({0: B},)))
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))


class FillsOfADynamicInput(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        fill = {
            "full_like": lambda: torch.full_like(x, 2.0),
            "zeros_like": lambda: torch.zeros_like(x[:, 0]).unsqueeze(1) + 1.0,
            "new_ones": lambda: x.new_ones(x.shape),
            "ones_like_slice": lambda: torch.ones_like(x[:, :, :1]),
        }[self.how]()
        return x * 3.0 + fill * 0.5


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("how", ["full_like", "zeros_like", "new_ones", "ones_like_slice"])
def test_a_fill_shaped_like_a_dynamic_input_is_never_evaluated_and_the_report_says_why(how, dialect):
    ep = export(FillsOfADynamicInput(how), (torch.randn(2, 3, 3),), dynamic_shapes=({0: B},))
    if dialect == "edge":
        ep = edge(ep)
    assert list(ep.range_constraints.values())[0].upper == 8  # still dynamic
    ref = copy.deepcopy(ep)
    result = fold_checked(ep)
    symbolic = [d for d in result.report.decisions if d.reason.name == "SYMBOLIC" and "free symbols" in d.detail]
    assert symbolic, [(d.node, d.reason.name, d.detail) for d in result.report.decisions]
    assert all(d.node in {n.name for n in result.program.graph.nodes} for d in symbolic)
    for batch in (2, 5, 8):
        x = torch.randn(batch, 3, 3)
        assert_close_all(outputs(ref, (x,)), outputs(result.program, (x,)))


@pytest.mark.parametrize("how", ["full_like", "new_ones"])
def test_a_dynamic_program_lowers_with_the_fold_pass_and_runs_at_each_batch(how):
    """`FoldConstantsPass` inside `to_edge_transform_and_lower`, portable and XNNPACK; the .pte
    runs at several batch sizes (memory planned for the upper bound)."""
    ep = export(FillsOfADynamicInput(how), (torch.randn(2, 3, 3),), dynamic_shapes=({0: B},))
    ref = copy.deepcopy(ep)
    for backend in ("portable", "xnnpack"):
        buffer = _lower(copy.deepcopy(ep), backend, [FoldConstantsPass()])
        for batch in (2, 5, 8):
            x = torch.randn(batch, 3, 3)
            assert_close_all(outputs(ref, (x,)), run_pte(buffer, (x,)), atol=1e-4)


def test_the_issue_program_lowers_with_the_fold_pass():
    """The same through `FoldConstantsPass` (Edge, after the decomposition that specialises)."""
    x = torch.randn(2, 3, 3)
    ep = export(IssueProgram(), (x,), dynamic_shapes=({0: B},))
    ref = copy.deepcopy(ep)
    buffer = _lower(copy.deepcopy(ep), "portable", [FoldConstantsPass()])
    assert_close_all(outputs(ref, (x,)), run_pte(buffer, (x,)), atol=1e-4)
