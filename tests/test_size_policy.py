"""Size limits: the planner's cuts, checked on real programs and against a brute-force search."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export.graph_signature import InputKind

from folding import FoldPolicy, Reason, fold_constants
from folding.sizes import STORED_KINDS, aligned, stored_constant_bytes
from folding.signature import input_specs_by_name
from tests.invariants import assert_report_bytes_true, assert_valid_program


def _constant_only_ops(ep) -> list[torch.fx.Node]:
    """call_function nodes whose inputs are all stored constants or other such nodes."""
    specs = input_specs_by_name(ep.graph_signature)
    const: set = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder" and specs[n.name].kind in STORED_KINDS:
            const.add(n)
        elif n.op == "call_function" and n.all_input_nodes and all(i in const for i in n.all_input_nodes):
            const.add(n)
        elif n.op == "call_function" and not n.all_input_nodes:
            const.add(n)
    return [n for n in ep.graph.nodes if n in const and n.op == "call_function"]


class BigExpand(nn.Module):
    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(4096, 1))

    def forward(self, x):
        return x + self.v.expand(4096, 4096) * 2


def test_expand_to_4096_square_is_not_materialised_under_16mib_cap():
    x = torch.randn(4096, 4096)
    ep = torch.export.export(BigExpand().eval(), (x,))
    result = fold_constants(ep, FoldPolicy(max_tensor_bytes=16 * 2**20))
    assert_valid_program(result.program)
    assert all(c.nbytes <= 16 * 2**20 for c in result.report.lifted)
    kept = {d.node: d.reason for d in result.report.decisions}
    assert kept["expand"] is Reason.MAX_TENSOR_BYTES
    assert torch.equal(ep.module()(x), result.program.module()(x))
    # without the cap the same program folds the expand (the cap is what decides)
    unlimited = fold_constants(ep, FoldPolicy.unlimited())
    assert any(c.nbytes == 4096 * 4096 * 4 for c in unlimited.report.lifted)


class TiedEmbeddingLM(nn.Module):
    def __init__(self, vocab=8000, dim=128):  # a 4 MB matrix: larger than the 1 MiB budget floor
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids):
        return F.linear(self.norm(self.emb(ids)), self.emb.weight)


def test_tied_embedding_matrix_is_stored_once_in_edge_program():
    from executorch.exir import to_edge

    ids = torch.randint(0, 8000, (1, 8))
    edge = to_edge(torch.export.export(TiedEmbeddingLM().eval(), (ids,))).exported_program()
    # Edge decomposes linear: permute_copy(emb.weight) is constant-only while embedding still reads it.
    assert any("permute" in str(n.target) for n in _constant_only_ops(edge))
    result = fold_constants(edge)
    assert_report_bytes_true(result)
    assert stored_constant_bytes(result.program) <= stored_constant_bytes(edge)
    big = [c for c in result.report.lifted if c.nbytes >= 8000 * 128 * 4]
    assert not big, f"a transposed copy of the tied embedding was stored: {big}"
    reasons = {d.node: d.reason for d in result.report.decisions}
    assert reasons["aten_permute_copy_default"] is Reason.GROWTH_BUDGET
    x = torch.randint(0, 8000, (1, 8))
    torch.testing.assert_close(result.program.module()(x), edge.module()(x))


class Tables(nn.Module):
    """Three independent regions, each growing the constants by a known amount."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(16))  # repeat 64x -> 1024 floats: +4032 bytes
        self.b = nn.Parameter(torch.randn(32))  # repeat 16x -> 512 floats: +1920 bytes
        self.c = nn.Parameter(torch.randn(8))  # repeat 8x -> 64 floats: +224 bytes

    def forward(self, x):
        return x[:1024] + self.a.repeat(64), x[:512] + self.b.repeat(16), x[:64] + self.c.repeat(8)


@pytest.mark.parametrize("budget", [0, 224, 1920, 2144, 4032, 6176, 10**6])
def test_growth_budget_holds_exactly(budget):
    x = torch.randn(2048)
    ep = torch.export.export(Tables().eval(), (x,))
    before = stored_constant_bytes(ep)
    result = fold_constants(ep, FoldPolicy(max_tensor_bytes=None, max_growth_bytes=budget, max_growth_fraction=None))
    assert_valid_program(result.program)
    growth = stored_constant_bytes(result.program) - before
    assert growth <= budget
    # the best choice: the most regions folded within the budget (fewest runtime ops), then the
    # smallest growth among those
    subsets = [(len(s), sum(s)) for s in ([], [224], [1920], [4032], [224, 1920], [224, 4032], [1920, 4032], [224, 1920, 4032])]
    folded, best_growth = min(((k, g) for k, g in subsets if g <= budget), key=lambda kg: (-kg[0], kg[1]))
    left = sum(1 for n in _constant_only_ops(result.program))
    assert left == 3 - folded and growth == best_growth
    for out_a, out_b in zip(ep.module()(x), result.program.module()(x)):
        assert torch.equal(out_a, out_b)


# --- random regions against brute force ----------------------------------------------------


def _random_region_module(rng: random.Random):
    """A module whose constant-only ops form one connected region of at most 12 ops over 1-D
    parameters of random sizes; 1-3 of its values are read by a runtime cat."""
    n_params = rng.randint(1, 3)
    lengths = [rng.randint(2, 40) for _ in range(n_params)]
    steps: list[tuple] = []
    sizes = {("p", i): lengths[i] for i in range(n_params)}
    values = [("p", 0)]
    used_params = 1
    seen: set = set()
    while len(steps) < rng.randint(3, 12) or used_params < n_params:
        if len(steps) >= 12:
            break
        src = rng.choice(values)
        kind = rng.choice(["exp", "mul", "repeat", "narrow", "add"])
        if kind == "add":
            other = ("p", used_params) if used_params < n_params else rng.choice(values)
            if other[0] == "p" and other[1] == used_params:
                used_params += 1
            key = (kind, src, other)
            m = min(sizes[src], sizes[other])
            out = m
        elif kind == "repeat":
            r = rng.choice([2, 3, 5])
            key, out = (kind, src, r), sizes[src] * r
        elif kind == "narrow":
            if sizes[src] < 3:
                continue
            m = rng.randint(1, sizes[src] - 2)
            key, out = (kind, src, m), m
        else:
            key, out = (kind, src), sizes[src]
        if key in seen:
            continue
        seen.add(key)
        node = ("v", len(steps))
        steps.append(key)
        sizes[node] = out
        values.append(node)
    sinks = rng.sample([v for v in values if v[0] == "v"], k=min(rng.randint(1, 3), len(steps)))

    class Region(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList([nn.Parameter(torch.randn(n)) for n in lengths])

        def forward(self, x):
            env = {("p", i): p for i, p in enumerate(self.ps)}
            for i, step in enumerate(steps):
                kind, src = step[0], env[step[1]]
                if kind == "exp":
                    out = src.exp()
                elif kind == "mul":
                    out = src * 1.5
                elif kind == "repeat":
                    out = src.repeat(step[2])
                elif kind == "narrow":
                    out = src.narrow(0, 1, step[2])
                else:
                    other = env[step[2]]
                    m = min(src.shape[0], other.shape[0])
                    out = src[:m] + other[:m]
                env[("v", i)] = out
            return torch.cat([x] + [env[s] for s in sinks])

    return Region()


def _brute_force(ep, cap, budget) -> tuple[int, int]:
    """Fewest runtime constant ops, then fewest stored bytes, over every cut within the limits."""
    specs = input_specs_by_name(ep.graph_signature)
    ops = _constant_only_ops(ep)
    op_set = set(ops)
    # Bytes as the .pte stores them: each buffer padded to 16 bytes (folding.sizes.aligned).
    size = {n: aligned(n.meta["val"].numel() * n.meta["val"].element_size()) for n in ops}
    param_bytes = {
        n: aligned(ep.state_dict[specs[n.name].target].nbytes)
        for n in ep.graph.nodes if n.op == "placeholder" and specs[n.name].kind is InputKind.PARAMETER
    }
    before = sum(param_bytes.values())
    sinks = [n for n in ops if any(u not in op_set for u in n.users)]
    storable = [n for n in ops if cap is None or size[n] <= cap]
    best = None
    for mask in range(1 << len(storable)):
        stored = {storable[i] for i in range(len(storable)) if mask >> i & 1}
        runtime, kept, used, stack, seen = set(), set(), set(), list(sinks), set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in stored:
                used.add(v)
            elif v in op_set:
                runtime.add(v)
                stack.extend(v.all_input_nodes)
            elif v in param_bytes:
                kept.add(v)
        total = sum(size[v] for v in used) + sum(param_bytes[p] for p in kept)
        if budget is not None and total - before > budget:
            continue
        cand = (len(runtime), total)
        best = cand if best is None or cand < best else best
    return best


@pytest.mark.parametrize("seed", range(24))
def test_planner_matches_brute_force_on_random_regions(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    module = _random_region_module(rng).eval()
    x = torch.randn(5)
    ep = torch.export.export(module, (x,))
    before = stored_constant_bytes(ep)
    cap = rng.choice([None, 64, 128, 256])
    budget = rng.choice([0, 32, 100, 400, None])
    policy = FoldPolicy(max_tensor_bytes=cap, max_growth_bytes=budget, max_growth_fraction=None)
    result = fold_constants(ep, policy)
    assert_valid_program(result.program)
    want_ops, want_bytes = _brute_force(ep, cap, budget)
    got_ops = len(_constant_only_ops(result.program))
    got_bytes = stored_constant_bytes(result.program)
    assert (got_ops, got_bytes) == (want_ops, want_bytes), (seed, cap, budget, before)
    assert torch.equal(ep.module()(x), result.program.module()(x))


class ShiftedWindowMask(nn.Module):
    """swin's mask: ``x.new_zeros`` then in-place fills through slices (training IR)."""

    def forward(self, x):
        m = x.new_zeros(8, 8)
        m[:4, :4] = 1.0
        m[4:, 4:] = 2.0
        return x + m.masked_fill(m != 0, -100.0)


def test_in_place_region_declined_by_the_budget_stays_whole_and_correct():
    x = torch.randn(8, 8)
    ep = torch.export.export(ShiftedWindowMask().eval(), (x,))
    strict = fold_constants(ep, FoldPolicy(max_tensor_bytes=None, max_growth_bytes=0, max_growth_fraction=None))
    assert_valid_program(strict.program)
    kept = {d.node: d.reason for d in strict.report.decisions}
    fills = [n for n in kept if n.startswith("fill_")]
    assert fills and all(kept[n] is Reason.GROWTH_BUDGET for n in fills)  # the fills stay with their mask
    assert torch.equal(ep.module()(x), strict.program.module()(x))
    folded = fold_constants(ep, FoldPolicy.unlimited())
    assert not [d for d in folded.report.kept_constant_only]
    assert torch.equal(ep.module()(x), folded.program.module()(x))
