"""Programs more than one test module folds (each documents what it exercises), and the
hand-built graphs the stage and cut tests run on."""

from __future__ import annotations

import itertools

import torch
import torch.nn as nn
from hypothesis import strategies as st
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan


class RewrittenAndHoisted(nn.Module):
    """A tied embedding read through its transpose (`folding.rewrites.transposed_gathers` rewrites the gather), and
    a ``cond`` whose branches compute the same bytes from the same weight in two ways (moved
    out and lifted as two constants of identical bytes)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2048, 256)  # 2 MiB: a second copy exceeds the growth budget
        self.w = nn.Parameter(torch.randn(256) * 0.1)

    def forward(self, ids, flag):
        def yes(h, w):
            return h * (w * 2).exp()

        def no(h, w):
            return h + (w + w).exp()

        h = torch.cond(flag.sum() > 0, yes, no, (self.emb(ids), self.w))
        return h @ self.emb.weight.t()


class OneCond(nn.Module):
    """Three lines, one ``cond``: constant code in both branches; the predicate reads the input
    (``runtime=True``) or only the weight (then the fold makes it a constant and inlines it)."""

    def __init__(self, runtime: bool):
        super().__init__()
        self.runtime = runtime
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        pred = (x.sum() if self.runtime else self.w.sum()) > 0
        return torch.cond(pred, lambda x: x @ (self.w * 2).t(), lambda x: x - self.w.exp(), (x,))


# An op whose schema declares no write but whose kernel writes its first argument: the kind of
# fault no table can list in advance, caught at fold time by the copy-on-write check.
_lib = torch.library.Library("fold_test", "DEF")
_lib.define("sneaky_bump(Tensor state, Tensor x) -> Tensor")


def _sneaky_bump(state, x):
    state.add_(1.0)  # undeclared: the schema says `Tensor state`, not `Tensor(a!) state`
    return x + state


_lib.impl("sneaky_bump", _sneaky_bump, "CompositeExplicitAutograd")
_lib.impl("sneaky_bump", lambda state, x: torch.empty_like(x), "Meta")


class SneakyWriter(nn.Module):
    """Calls `fold_test.sneaky_bump` on two buffers: the write to ``state`` is undeclared."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))
        self.register_buffer("c", torch.arange(3.0))

    def forward(self, x):
        y = torch.ops.fold_test.sneaky_bump(self.state, self.c)  # constant inputs only
        return x + y, self.state * 10.0


# Control-flow programs that fold into operand merging, moved-out bodies or removed control flow,
# each also folded in Edge dialect (tests/test_control_flow.py).

def _same_after_folding(w: torch.Tensor, how: str) -> torch.Tensor:
    return {"mul1": lambda: w * 1.0, "add0": lambda: w + 0.0, "clone": lambda: w.clone()}[how]()


class CondRepeated(nn.Module):
    """A ``cond`` given a weight and a value with its bytes (``w * 1.0``, ``w + 0.0``,
    ``w.clone()``): the value is a constant of its own, not the weight."""

    def __init__(self, how: str):
        super().__init__()
        self.w, self.how = nn.Parameter(torch.randn(4)), how

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x, a, b: (x + a) * b, lambda x, a, b: (x - a) * b,
                          (x, self.w, _same_after_folding(self.w, self.how)))


class MapRepeated(nn.Module):
    """A ``map`` given a weight and its identical copy as operands."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        return hop_map(lambda xi, a, b: (xi + a) * b, xs, self.w, self.w + 0.0)


class ScanRepeated(nn.Module):
    """A ``scan`` given a weight and its identical copy as additional inputs."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, xs):
        a, b = self.w, self.w * 1.0

        def combine(carry, xi):  # a and b become the scan's additional inputs
            y = carry * a + xi * b
            return y, y.clone()

        return scan(combine, torch.zeros(4), xs)


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


class CondWithoutOperands(nn.Module):
    """Branches whose constant code reads no operand (`bodies` moves it out all the same)."""

    def forward(self, x):
        c = torch.cond(x.sum() > 0, lambda a: (torch.full((4,), -0.5) * 1.0,), lambda a: (torch.ones(4) * 2.0,), (x,))
        return c[0] + x


class ConstantCond(nn.Module):
    """A ``cond`` on constants only, predicate included: folded away entirely."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("flag", torch.tensor(False))

    def forward(self, x):
        c = torch.cond(self.flag, lambda w: (w.exp(),), lambda w: (w.cos() * 2,), (self.w,))[0]
        return x + c


class ConstantScan(nn.Module):
    """A ``scan`` over a weight's rows: folded away entirely."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        def combine(carry, wi):
            y = carry + wi.sin()
            return y, y.clone()

        carry, ys = scan(combine, torch.zeros(4), self.w)
        return x + carry + ys.sum(0)


class Block(nn.Module):
    """Two layers that each compute the same constant subexpression, a mask, and a transpose."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(8, 8)
        self.l2 = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        gate = (torch.arange(8.0) * 0.25).exp()  # identical in both layers
        h = self.l1(x) * gate
        h = self.l2(h) * (torch.arange(8.0) * 0.25).exp()
        mask = torch.triu(torch.full((8, 8), float("-inf")), diagonal=1)
        return h @ (self.w.t() * 0.5) + mask


class Layers(nn.Module):
    """Same-shape random weights (told apart by their fingerprints), each applied to a buffer
    (a fold) and to the input, and a tied pair (one Parameter under two names)."""

    def __init__(self, n: int = 6, d: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.tied = nn.Linear(d, d, bias=False)
        self.tied_again = nn.Linear(d, d, bias=False)
        self.tied_again.weight = self.tied.weight
        self.register_buffer("b", torch.randn(2, d))

    def forward(self, x):
        folded = sum(layer(self.b) for layer in self.layers)
        for layer in self.layers:
            x = layer(x)
        return self.tied_again(self.tied(x)) + folded.sum(0)


class IdenticalCopies(nn.Module):
    """Identical weights in separate storages (stored once), read by folds and at runtime."""

    def __init__(self):
        super().__init__()
        self.register_buffer("a", torch.ones(4096))
        self.register_buffer("b", torch.ones(4096))
        self.register_buffer("c", torch.ones(4096))

    def forward(self, x):
        return x * self.a + self.b * 2.0, x + self.c, x + self.b


# Hand-built graphs -------------------------------------------------------------------------
#
# A few `torch.fx.Graph` nodes, for the stages run one at a time (`tests/fold_checks.run_stages`)
# and for the cuts, which read only the sizes they are given.


def fx_op(g: torch.fx.Graph, name: str, target, *args) -> torch.fx.Node:
    return g.create_node("call_function", target, args, name=name)


def chain_graph(w: torch.Tensor, x: torch.Tensor):
    """``y = exp(w * 2) + x`` and a factory ``z = full(shape_of(w), 3) * w`` returned too; a
    signature made by `bodies.body_signature` (``w`` constant); real tensors in ``meta["val"]``."""
    from folding.control_flow.bodies import body_signature

    g = torch.fx.Graph()
    pw, px = g.placeholder("w"), g.placeholder("x")
    mul = fx_op(g, "mul", torch.ops.aten.mul.Tensor, pw, 2.0)
    exp = fx_op(g, "exp", torch.ops.aten.exp.default, mul)
    add = fx_op(g, "add", torch.ops.aten.add.Tensor, exp, px)
    full = fx_op(g, "full", torch.ops.aten.full.default, list(w.shape), 3.0)
    z = fx_op(g, "mul_1", torch.ops.aten.mul.Tensor, full, pw)
    g.output((add, z))
    vals = {pw: w, px: x, mul: w * 2, exp: (w * 2).exp(), add: (w * 2).exp() + x, full: torch.full(w.shape, 3.0),
            z: 3.0 * w}
    for n, v in vals.items():
        n.meta["val"] = v
    signature = body_signature([pw, px], {pw})
    return g, signature, {n.name: n for n in g.nodes}


_ADD = torch.ops.aten.add.Tensor


def region_graph(draw_ops: list[tuple[int, int]], sinks: set[int], n_placeholders: int, read_at_runtime: set[int]):
    """Placeholders ``w0..``, then op i reading the two earlier nodes ``draw_ops[i]`` (indices
    into placeholders + earlier ops), then a runtime ``add(op, x)`` for each op in `sinks` and
    an ``add(w, x)`` for each placeholder in `read_at_runtime` (it stays, whatever is stored)."""
    g = torch.fx.Graph()
    ws = [g.placeholder(f"w{i}") for i in range(n_placeholders)]
    x = g.placeholder("x")
    nodes = list(ws)
    ops = []
    for i, (a, b) in enumerate(draw_ops):
        op = g.create_node("call_function", _ADD, (nodes[a % len(nodes)], nodes[b % len(nodes)]), name=f"op{i}")
        nodes.append(op)
        ops.append(op)
    outs = [g.create_node("call_function", _ADD, (ops[i], x), name=f"run{i}") for i in sorted(sinks)]
    outs += [g.create_node("call_function", _ADD, (ws[i], x), name=f"read_w{i}") for i in sorted(read_at_runtime)]
    g.output(tuple(outs))
    return g, ws, ops


@st.composite
def regions(draw):
    """A random DAG of a few constant ops over constant placeholders, some read by a runtime op
    (the region's sinks), cut into regions by `folding.core.cuts.find_regions`; node sizes are drawn,
    not derived from tensors. Returns (regions, sizes, placeholder bytes, storable ops)."""
    from folding.core.cuts import find_regions

    n_placeholders = draw(st.integers(1, 2))
    n_ops = draw(st.integers(1, 7))
    draw_ops = [(draw(st.integers(0, n_placeholders + i - 1)), draw(st.integers(0, n_placeholders + i - 1)))
                for i in range(n_ops)]
    sinks = set(draw(st.sets(st.integers(0, n_ops - 1), min_size=1)))
    sinks.add(n_ops - 1)
    read_at_runtime = draw(st.sets(st.integers(0, n_placeholders - 1)))
    g, ws, ops = region_graph(draw_ops, sinks, n_placeholders, read_at_runtime)
    sizes = {op: 16 * draw(st.integers(0, 8)) for op in ops}
    placeholder_bytes = {w: 16 * draw(st.integers(1, 8)) for w in ws}
    storable = {op for op in ops if draw(st.booleans()) or op.name == f"op{n_ops - 1}"}
    folded = set(ops)
    found = find_regions(ops, folded.__contains__, set(ws), placeholder_bytes, fixed=set())
    return found, sizes, placeholder_bytes, storable


def every_plan(region, sizes, placeholder_bytes, storable):
    """Every cut of `region` (`folding.core.cuts.evaluate_cut` of each subset of its storable ops)."""
    from folding.core.cuts import evaluate_cut

    candidates = [n for n in region.ops if n in storable]
    return [evaluate_cut(region, frozenset(s), sizes, placeholder_bytes, {})
            for k in range(len(candidates) + 1) for s in itertools.combinations(candidates, k)]


class ReadTwiceAndBranches(nn.Module):
    """Buffers each read twice by one op (``mm(b, b)``, so that evaluation hands the op two
    copy-on-write stand-ins of one stored tensor and the tensor's data moves to a new address)
    and folded values of their shape and dtype, then three ``cond`` calls on those values: the
    program on which a fold keyed by tensor addresses gave wrong values from the second fold
    of a process on (one buffer stored in place of a folded value)."""

    def __init__(self, n: int = 8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.n = n
        for i in range(n):  # written once in place, as initialisers do: version 1
            self.register_buffer(f"b{i}", torch.randn(64, 64, generator=g).mul_(1.0))

    def forward(self, x):
        h = x
        for i in range(self.n):
            b = getattr(self, f"b{i}")
            h = h + x @ (torch.mm(b, b) * 0.01) + x @ b
        h = torch.cond(h.sum() > 0, lambda h, b: (h @ b.t(),), lambda h, b: (h - b.mean(0),), (h, self.b0 * 2.0))[0]
        h = torch.cond(h.mean() > 0, lambda h, b: (h * b.exp(),), lambda h, b: (h + b,), (h, self.b1[0] * 0.5))[0]
        return torch.cond(h.amax() > 0, lambda h, b: (h + b.cos(),), lambda h, b: (h - b,), (h, self.b2[1] + 1.0))[0]
