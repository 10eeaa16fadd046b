"""Cost (invariant 9): work per node is constant, intermediates are freed after last use, and
the report's phase timings account for the whole call.

These count work instead of timing it; the timings are in `python -m benchmarks.scale`.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import torch.nn as nn

from benchmarks.synthetic import chain_program
from folding import fold_constants
from folding.report import PHASES
from tests.invariants import assert_close_all, assert_valid_program
from tests.programs import IdenticalCopies, Layers, RewrittenAndHoisted, SneakyWriter

_SIGNATURE_FILE = "torch/export/graph_signature.py"


def _count_calls(fn, counts) -> int:
    """Python function calls made while `fn` runs for which ``counts(code)`` is true."""
    count = 0

    def profiler(frame, event, arg):
        nonlocal count
        if event == "call" and counts(frame.f_code):
            count += 1

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def _count_signature_calls(fn) -> int:
    """Calls into torch.export.graph_signature made while `fn` runs (its derived properties,
    such as ``inputs_to_parameters``, rebuild a dict from every InputSpec on each access).
    Constructors (one InputSpec per new lifted constant) are writes, not reads."""
    return _count_calls(fn, lambda code: code.co_filename.endswith(_SIGNATURE_FILE)
                        and code.co_name not in ("__init__", "__post_init__"))


def test_signature_reads_do_not_grow_with_program_size():
    small, large = chain_program(20, "EDGE"), chain_program(200, "EDGE")
    calls_small = _count_signature_calls(lambda: fold_constants(small))
    calls_large = _count_signature_calls(lambda: fold_constants(large))
    # a constant number of signature reads per run, not one per node
    assert 0 < calls_large == calls_small


def test_aten_and_edge_chains_fold_with_evaluations_linear_in_size():
    for dialect in ("ATEN", "EDGE"):
        runs = {}
        for layers in (30, 300):
            ep = chain_program(layers, dialect)
            result = fold_constants(ep)
            assert_valid_program(result.program)
            runs[layers] = result.report
        # every constant-only op is evaluated exactly once: 6 per layer
        assert runs[30].evaluated_nodes == 6 * 30 and runs[300].evaluated_nodes == 6 * 300


class LargeChain(nn.Module):
    """Six constant-only ops, each producing a new 4 MiB tensor, read at runtime at the end."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(1024, 1024))

    def forward(self, x):
        k = self.w
        for _ in range(3):
            k = (k * 1.01).exp().tanh()
        return x + k


def test_live_intermediates_stay_within_the_largest_two():
    x = torch.randn(1024, 1024)
    ep = torch.export.export(LargeChain().eval(), (x,))
    result = fold_constants(ep)
    one = 1024 * 1024 * 4
    # 9 intermediates of 4 MiB each: at most the input and the output of one op are alive
    assert 0 < result.report.peak_intermediate_bytes <= 2 * one
    assert_close_all(ep.module()(x), result.program.module()(x))


def _count_codegen_calls(fn) -> int:
    """Python code generations of fx graphs (``Graph.python_code``) while `fn` runs."""
    return _count_calls(fn, lambda code: code.co_name == "python_code" and code.co_filename.endswith("torch/fx/graph.py"))


def _graph_module_inputs(program, *user_inputs) -> list:
    """The flat arguments of `program.graph_module`: its stored tensors and `user_inputs`, in
    placeholder order."""
    stored = {**program.state_dict, **program.constants}
    users = iter(user_inputs)
    return [next(users) if spec.kind.name == "USER_INPUT" else stored[spec.target]
            for spec in program.graph_signature.input_specs]


def test_the_folded_program_is_compiled_on_first_use_only():
    """Generating and compiling the folded graph's code costs about as much as the rest of a
    fold of a few hundred nodes, and `to_edge` (like `module()` and `torch.export.save`) never
    uses it: the fold generates none; calling the folded graph module compiles it then."""
    from executorch.exir import to_edge

    ep = chain_program(200, "ATEN")
    results = []
    assert _count_codegen_calls(lambda: results.append(fold_constants(ep))) == 0
    folded = results[0].program
    assert_valid_program(folded)
    # outside the counter (its profile hook on every Python call made this test 11 s, not 5): the
    # count of 1 below also says that to_edge never compiled the folded graph
    to_edge(folded)
    x = torch.randn(4, 4)
    want = ep.module()(x)
    calls = []
    assert _count_codegen_calls(lambda: calls.append(folded.graph_module(*_graph_module_inputs(folded, x)))) == 1
    got = calls[0][0]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max())), (got - want).abs().max()
    assert "placeholder" not in folded.graph_module.code and "def forward" in folded.graph_module.code


def _count_node_copies(fn) -> int:
    """``Graph.node_copy`` calls while `fn` runs: how the fold copies (and rebuilds) graphs."""
    return _count_calls(fn, lambda code: code.co_name == "node_copy" and code.co_filename.endswith("torch/fx/graph.py"))


@pytest.mark.parametrize("dialect", ["ATEN", "EDGE"])
def test_each_graph_the_fold_edits_is_copied_once(dialect):
    """Rewriting the gathers, moving constant code out of the bodies, and passing a repeated
    operand once all edit the same copies: one node copy per node of the top-level graph and
    of each body, one per node moved out of a body, and `lift`'s one per node of the folded
    program (it builds the folded graph from the surviving nodes; before: the top-level graph
    copied three times and each body twice, 68 copies on ATen)."""
    from executorch.exir import to_edge

    ids, flag = torch.randint(0, 2048, (2, 7)), torch.tensor([1])
    ep = torch.export.export(RewrittenAndHoisted().eval(), (ids, flag))
    if dialect == "EDGE":
        ep = to_edge(ep).exported_program()
    graphs = [m.graph for m in ep.graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    assert len(graphs) == 3
    results = []
    copies = _count_node_copies(lambda: results.append(fold_constants(ep)))
    report = results[0].report
    moved = sum(1 for d in report.decisions if "/" in d.node and d.folded)  # body path: moved out, folded
    assert report.rewrites and moved > 0  # both rewrites applied
    folded = results[0].program
    hops = [n for n in folded.graph.nodes if n.op == "call_function" and "cond" in str(n.target)]
    assert len(hops) == 1 and len(hops[0].args[3]) == len(set(hops[0].args[3]))  # each operand passed once
    assert 0 < copies <= sum(len(g.nodes) for g in graphs) + moved + len(folded.graph.nodes), copies
    for flip in (1, -1):
        x = (ids, flag * flip)
        want, got = ep.module()(*x), folded.module()(*x)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.detach().abs().max()))


def _transposed_mlp():
    """Edge reads each ``linear`` weight through a ``permute_copy``: folding stores the
    transposed weights (3 MiB, beyond the default 1 MiB budget) and drops the originals."""
    from executorch.exir import to_edge

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).eval()
    return to_edge(torch.export.export(mlp, (torch.randn(2, 512),))).exported_program(), (2, 512)


@pytest.mark.parametrize("make", [
    lambda: (chain_program(20, "ATEN"), (4, 4)),
    lambda: (chain_program(20, "EDGE"), (4, 4)),
    lambda: (torch.export.export(_InPlaceOnAConstant().eval(), (torch.randn(4, 4),)), (4, 4)),  # keeps add_
    _transposed_mlp,
], ids=["chain-aten", "chain-edge", "in-place-op", "transposed-weights"])
def test_an_in_place_fold_folds_a_copy_and_gives_the_copying_folds_program(make):
    """Invariants 7 and 9: ``inplace=True`` folds as the copying fold does (the same node
    copies), then puts the result into the caller's program object. No rewrite applies to
    these programs, so the caller's graph is read, never copied whole: `lift` copies only the
    nodes that survive into the folded program (all its nodes but the new placeholders)."""
    ep, shape = make()
    x = torch.randn(*shape)
    want = ep.module()(x)
    kept = []
    copies_kept = _count_node_copies(lambda: kept.append(fold_constants(ep)))
    shared = copy.deepcopy(ep)
    results = []
    copies_in_place = _count_node_copies(lambda: results.append(fold_constants(shared, inplace=True)))
    report = kept[0].report
    new_placeholders = {c.placeholder for c in report.lifted if not c.reused}
    assert not report.rewrites and report.folded and new_placeholders
    assert copies_in_place == copies_kept == len(kept[0].program.graph.nodes) - len(new_placeholders)
    assert copies_kept < len(ep.graph.nodes)
    assert results[0].program is shared
    assert_valid_program(shared)
    assert [n.name for n in shared.graph.nodes] == [n.name for n in kept[0].program.graph.nodes]
    assert_close_all(want, shared.module()(x), relative=True, min_scale=0.1)
    assert_close_all(want, kept[0].program.module()(x), relative=True, min_scale=0.1)


class _InPlaceOnAConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        y = self.w * 2
        y.add_(1)
        return x + y


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x, w: x + w * 2, lambda x, w: x - w.exp(), (x, self.w))


@pytest.mark.parametrize("module, shape, rerun", [
    (Layers, (2, 64), False),
    (IdenticalCopies, (4096,), False),
    (Branches, (4,), False),
    (SneakyWriter, (3,), True),  # an undeclared write found by evaluation: one rerun
])
def test_phase_timings_add_up_to_the_total(module, shape, rerun):
    ep = torch.export.export(module().eval(), (torch.randn(*shape),))
    timings = fold_constants(ep).report.timings
    phases = {k: v for k, v in timings.items() if k != "total"}
    assert set(phases) <= set(PHASES) and all(v >= 0 for v in phases.values())
    assert {"checks", "bytes", "analysis", "planning", "evaluation", "lift", "report"} <= set(phases)
    assert ("reruns" in phases) is rerun
    # the phases cover the whole call: only a few statements between them are not timed
    assert abs(sum(phases.values()) - timings["total"]) <= 0.05 * timings["total"] + 0.002
