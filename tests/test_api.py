"""The public surface: caller's program untouched unless ``inplace=True``, determinism,
`FoldConstantsPass` in executorch's pass machinery, the command line, the report, and bounded
work (docs/design.md invariants 7, 8, 9). Where folded values are stored, and identical bytes
counted once: test_placement.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import folding
from folding import FoldConstantsPass, FoldPolicy, Reason
from folding.core.analysis import _node_reason
from tests.work import calls
from tests.fold_checks import (
    assert_edge_pte_matches,
    call_targets,
    assert_fold_invariants,
    decision,
    edge,
    export,
    fold,
    reference,
)
from tests.invariants import assert_close_all, assert_same_outputs
from tests.programs import Block
from tests.invariants import (
    assert_pte_matches,
    assert_snapshot_equal,
    assert_valid_program,
    outputs,
    state_snapshot,
)
from tests.lowering import lower_pte, run_pte

REPO = Path(__file__).resolve().parents[1]


# 8. The caller's program --------------------------------------------------------------------


def test_caller_program_is_unchanged_when_not_inplace():
    ep = export(Block(), (torch.randn(2, 8, 8),))
    x = torch.randn(2, 8, 8)
    before_out = outputs(ep, (x,))
    snapshot = state_snapshot(ep)
    graph_module, signature = ep.graph_module, ep.graph_signature
    result = fold(ep)
    assert result.program is not ep and result.report.folded
    assert_snapshot_equal(snapshot, state_snapshot(ep))
    assert ep.graph_module is graph_module and ep.graph_signature is signature
    assert_valid_program(ep)
    assert_close_all(before_out, outputs(ep, (x,)))
    # Folding again from the untouched caller gives the same result.
    assert str(folding.fold_constants(ep).program.graph) == str(result.program.graph)


def test_inplace_folds_and_returns_the_callers_program_object():
    ep = export(Block(), (torch.randn(2, 8, 8),))
    ref = reference(ep)
    result = folding.fold_constants(ep, inplace=True)
    assert_fold_invariants(ref, result, storages_of=ref)
    assert result.program is ep
    assert "aten.t.default" not in call_targets(ep) and "aten.triu.default" not in call_targets(ep)
    assert_valid_program(ep)
    assert_same_outputs(ref, ep, (torch.randn(2, 8, 8),))


@pytest.mark.parametrize("raised, error", [
    (lambda: folding.FoldInvariantError("the folded program fails lint"), folding.FoldInvariantError),
    (lambda: RuntimeError("a bug after lift"), folding.FoldInternalError),
])
def test_inplace_fold_that_raises_leaves_the_callers_program_unchanged(monkeypatch, raised, error):
    """Invariant 7: an in-place fold works on a copy and replaces the caller's contents only
    once the folded program has passed its checks. Here `lift` really rebuilds the graph it is
    given, then the stage fails (as a failed check or a bug would): the caller's graph,
    signature, dicts, tensors and outputs are those it had."""
    import folding.fold as fold_module

    ep = export(Block(), (torch.randn(2, 8, 8),))
    x = torch.randn(2, 8, 8)
    before_out, snapshot = outputs(ep, (x,)), state_snapshot(ep)
    graph_module, signature, nodes = ep.graph_module, ep.graph_signature, [n.name for n in ep.graph.nodes]
    real_lift = fold_module.lift
    lifted = []

    def lift_then_fail(*args, **kwargs):
        lifted.append(real_lift(*args, **kwargs))
        raise raised()

    monkeypatch.setattr(fold_module, "lift", lift_then_fail)
    with pytest.raises(error):
        folding.fold_constants(ep, inplace=True)
    assert lifted and lifted[0][1] is not None  # the graph lift was given was edited
    assert [n.name for n in lifted[0][0].graph.nodes] != nodes
    assert ep.graph_module is graph_module and ep.graph_signature is signature
    assert [n.name for n in ep.graph.nodes] == nodes
    assert_snapshot_equal(snapshot, state_snapshot(ep))
    assert_valid_program(ep)
    assert_close_all(before_out, outputs(ep, (x,)))


@torch.library.custom_op("fold_api_test::collector_state", mutates_args=())
def _collector_state(x: torch.Tensor) -> torch.Tensor:
    """The identity, recording whether the cyclic garbage collector is on when it runs."""
    import gc

    _COLLECTOR_SEEN.append(gc.isenabled())
    return x.clone()


_collector_state.register_fake(lambda x: torch.empty_like(x))
_COLLECTOR_SEEN: list[bool] = []


class _ReadsTheCollector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x + _collector_state(self.w * 2)


def test_a_fold_changes_no_process_wide_state():
    """A library call leaves the process's settings alone: the cyclic garbage collector runs
    while the fold evaluates its ops (another thread of the caller's process may need it)."""
    import gc

    ep = export(_ReadsTheCollector(), (torch.randn(4),))
    thresholds = gc.get_threshold()
    _COLLECTOR_SEEN.clear()
    result = folding.fold_constants(ep)
    assert result.report.folded
    assert _COLLECTOR_SEEN == [gc.isenabled()] and gc.isenabled()
    assert gc.get_threshold() == thresholds


# 9. Determinism -----------------------------------------------------------------------------


def test_folding_twice_gives_identical_programs_and_byte_identical_pte():
    ep = export(Block(), (torch.randn(2, 8, 8),))
    a, b = folding.fold_constants(ep), folding.fold_constants(ep)
    assert_fold_invariants(ep, a)
    assert str(a.program.graph) == str(b.program.graph)
    assert str(a.program.graph_signature) == str(b.program.graph_signature)
    assert list(a.program.constants) == list(b.program.constants)
    for key, value in a.program.constants.items():
        other = b.program.constants[key]
        assert value.dtype == other.dtype and torch.equal(value, other), key
    assert list(a.program.state_dict) == list(b.program.state_dict)
    da, db = a.report.to_dict(), b.report.to_dict()
    da.pop("timings_s"), db.pop("timings_s")
    assert da == db
    x = torch.randn(2, 8, 8)
    pte_a = assert_pte_matches(a.program, (x,), expected=outputs(ep, (x,)))
    pte_b = lower_pte(b.program)
    assert pte_a == pte_b


# Run in a fresh process: a fold that depended on the process's memory history (tensor
# addresses, identities, version counters remembered across the steps of a fold) showed only
# from some fold of a process on. Each later fold must equal the first one exactly.
_FOLD_AGAIN = """
import copy, io, sys, torch
import folding
from folding import FoldPolicy
from tests.invariants import assert_close_all, outputs, same_bits
from tests.lowering import lower_pte
from tests.programs import ReadTwiceAndBranches

def fingerprint(result):
    p, report = result.program, result.report.to_dict()
    report.pop("timings_s")
    stored = {k: (v.dtype, tuple(v.shape), v.stride(), v) for k, v in {**p.state_dict, **p.constants}.items()}
    return p.graph_module.code, str(p.graph_signature), stored, report

torch.manual_seed(0)
module = ReadTwiceAndBranches().eval()
ep = torch.export.export(module, (torch.randn(4, 64),))
inputs = [(torch.randn(4, 64),), (-torch.randn(4, 64).abs() * 10,)]
policy = FoldPolicy(fuse_into_weights=False)
first = folding.fold_constants(ep, policy)
want = fingerprint(first)
first.program.module()(*inputs[0])
saved = io.BytesIO()
torch.export.save(first.program, saved)
saved.seek(0)
torch.export.load(saved).module()(*inputs[0])
lower_pte(first.program)
for attempt in range(5):
    again = folding.fold_constants(ep, policy)
    got = fingerprint(again)
    assert got[0] == want[0], f"fold {attempt + 2}: graph code differs"
    assert got[1] == want[1], f"fold {attempt + 2}: signature differs"
    assert got[2].keys() == want[2].keys(), f"fold {attempt + 2}: stored targets differ"
    for k, (dtype, shape, stride, t) in got[2].items():
        assert (dtype, shape, stride) == want[2][k][:3] and same_bits(t, want[2][k][3]), f"fold {attempt + 2}: {k} differs"
    assert got[3] == want[3], f"fold {attempt + 2}: report differs"
    for x in inputs:
        assert_close_all(module(*x), outputs(again.program, x), 1e-5, relative=True)
print("ok")
"""


@pytest.mark.parametrize("process", range(3))
def test_folding_again_in_one_process_gives_the_same_program_after_running_saving_and_lowering(process):
    """Invariant 8 at any point of a program's life: fold, run the result, save and load it,
    lower it, then fold the same program five more times in the same (fresh) process: the
    same graph code, signature, stored tensors (dtype, shape, strides, bits), report, and the
    eager outputs."""
    proc = subprocess.run([sys.executable, "-c", _FOLD_AGAIN], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_refolding_a_folded_program_changes_nothing():
    class ConstOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return x + 1, self.w.t() * 2

    first = folding.fold_constants(export(ConstOut(), (torch.randn(4, 4),))).program
    again = folding.fold_constants(first)
    assert not again.report.folded, again.report.folded
    assert str(again.program.graph) == str(first.graph)


# 15. FoldConstantsPass in executorch's pass machinery ---------------------------------------


def test_fold_pass_in_to_edge_transform_and_lower_folds_edge_program_and_pte_runs():
    from executorch.exir import to_edge_transform_and_lower

    ep = export(Block(), (torch.randn(2, 8, 8),))
    fold_pass = FoldConstantsPass()
    manager = to_edge_transform_and_lower(ep, transform_passes=[fold_pass])
    report = fold_pass.report
    assert report is not None and report.folded
    folded_edge = manager.exported_program()
    targets = call_targets(folded_edge)
    assert "aten.exp.default" not in targets and "aten.arange.start_step" not in targets
    assert not report.kept_constant_only
    x = torch.randn(2, 8, 8)
    want = outputs(ep, (x,))
    assert_close_all(want, outputs(folded_edge, (x,)))
    assert_close_all(want, run_pte(manager.to_executorch().buffer, (x,)), atol=1e-4)


def test_fold_pass_with_xnnpack_partitioner_lowers_and_runs():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = export(Block(), (torch.randn(2, 8, 8),))
    fold_pass = FoldConstantsPass()
    manager = to_edge_transform_and_lower(ep, transform_passes=[fold_pass], partitioner=[XnnpackPartitioner()])
    assert fold_pass.report.folded
    x = torch.randn(2, 8, 8)
    assert_close_all(outputs(ep, (x,)), run_pte(manager.to_executorch().buffer, (x,)), atol=1e-4)


@pytest.mark.parametrize("dialect", ["aten", "edge"])
def test_fold_pass_in_exported_program_pass_manager(dialect):
    from executorch.exir.pass_manager import ExportedProgramPassManager

    ep = export(Block(), (torch.randn(2, 8, 8),))
    if dialect == "edge":
        ep = edge(ep)
    ref = reference(ep)
    fold_pass = FoldConstantsPass()
    result = ExportedProgramPassManager([fold_pass])(ep)
    assert result.modified and fold_pass.report.folded
    program = result.exported_program
    assert_valid_program(program)
    assert "aten.exp.default" not in call_targets(program)
    x = torch.randn(2, 8, 8)
    want = assert_same_outputs(ref, program, (x,))
    if dialect == "edge":
        assert_edge_pte_matches(program, (x,), want)


def test_fold_pass_in_pass_manager_leaves_callers_program_unchanged():
    from executorch.exir.pass_manager import ExportedProgramPassManager

    ep = export(Block(), (torch.randn(2, 8, 8),))
    snapshot = state_snapshot(ep)
    ExportedProgramPassManager([FoldConstantsPass()])(ep)
    assert_snapshot_equal(snapshot, state_snapshot(ep))
    assert_valid_program(ep)


# 16. Command line ---------------------------------------------------------------------------


def test_command_line_folds_a_saved_program_and_writes_the_report(tmp_path):
    ep = export(Block(), (torch.randn(2, 8, 8),))
    src, dst, report_path = tmp_path / "in.pt2", tmp_path / "out.pt2", tmp_path / "r.json"
    torch.export.save(ep, src)
    proc = subprocess.run(
        [sys.executable, "-m", "folding", str(src), "-o", str(dst), "--report", str(report_path),
         "--skip", "aten.triu.default"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Constant folding report" in proc.stdout
    folded = torch.export.load(dst)
    # Not assert_valid_program: torch.export.load hands back constants that are views of the
    # archive's storage (t._base is set), which its in-memory storage check rejects.
    folded.validate()
    placeholders = [n.name for n in folded.graph.nodes if n.op == "placeholder"]
    assert placeholders == [s.arg.name for s in folded.graph_signature.input_specs]
    assert "aten.triu.default" in call_targets(folded) and "aten.exp.default" not in call_targets(folded)
    report = json.loads(report_path.read_text())
    reasons = {d["node"]: d["reason"] for d in report["decisions"]}
    assert reasons["triu"] == "SKIPPED_TARGET" and reasons["exp"] == "FOLDED"
    assert report["constant_bytes_after"] == folding.core.sizes.stored_constant_bytes(folded)
    assert_same_outputs(ep, folded, (torch.randn(2, 8, 8),))


def test_command_line_reports_a_missing_input_without_traceback(tmp_path, capsys):
    from folding.__main__ import main

    assert main([str(tmp_path / "missing.pt2"), "-o", str(tmp_path / "o.pt2")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "missing.pt2" in err
    assert not (tmp_path / "o.pt2").exists()


def test_the_documented_command_lines_use_flags_the_command_has(capsys):
    """README and docs/design.md write ``python -m folding IN.pt2 -o OUT.pt2 [--flag ...]``: each flag
    they name is one ``python -m folding --help`` lists, and the longest line of each (README's
    usage, design.md's public names) names every option the command has (issue 52: design.md's
    lacked four)."""
    import re

    from folding.__main__ import build_parser, main

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    root = Path(__file__).resolve().parents[1]
    commands = [c for doc in ("README.md", "docs/design.md")
                for c in re.findall(r"`python -m folding ([^`]*)`", (root / doc).read_text())]
    assert len(commands) >= 2, commands
    for command in commands:
        flags = re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", command)
        assert flags and all(re.search(rf"(?<![\w-]){f}(?![\w-])", help_text) for f in flags), command
    options = [a.option_strings for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    for doc in ("README.md", "docs/design.md"):
        full = max(re.findall(r"`python -m folding ([^`]*)`", (root / doc).read_text()), key=len)
        named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", full))
        assert all(named & set(strings) for strings in options), (doc, full, options)


# Report -------------------------------------------------------------------------------------


def test_report_serialises_and_summarises_every_decision():
    ep = export(Block(), (torch.randn(2, 8, 8),))
    result = fold(ep, FoldPolicy(skip_targets={"aten.triu"}))
    data = json.loads(json.dumps(result.report.to_dict()))
    assert len(data["decisions"]) == len(result.report.decisions)
    assert data["counts"] == result.report.counts()
    assert sum(data["counts"].values()) == len(data["decisions"])
    assert data["constant_bytes_after"] == result.report.constant_bytes_after
    md = result.report.to_markdown()
    assert "SKIPPED_TARGET" in md and "triu" in md
    for lifted in result.report.lifted:
        assert lifted.placeholder in md
    assert decision(result.report, "triu").reason is Reason.SKIPPED_TARGET


# 17. Cost: bounded work per node ------------------------------------------------------------


class Chain(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4, 4)) for _ in range(layers)])
        self.bs = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4)) for _ in range(layers)])

    def forward(self, x):
        for w, b in zip(self.ws, self.bs):
            x = torch.tanh(x @ ((w.t() * 0.5).exp() + b.unsqueeze(0)))  # t, mul, exp, unsqueeze, add: constant
        return x


def _work(layers):
    ep = export(Chain(layers), (torch.randn(2, 4),))
    n_nodes = len(ep.graph.nodes)
    with calls(analysis_nodes=_node_reason) as work:
        result = folding.fold_constants(ep)
    report = result.report
    assert "reruns" not in report.timings, report.timings  # one attempt
    assert len(report.folded) == 5 * layers and len(report.lifted) == layers
    assert report.evaluated_nodes == len(report.folded)  # each folded op runs exactly once
    assert_same_outputs(ep, result.program, (torch.randn(2, 4),), atol=1e-3)
    return work["analysis_nodes"] / n_nodes, report.evaluated_nodes / layers, report.peak_intermediate_bytes


def test_work_per_node_does_not_grow_with_program_size():
    small_visits, small_evals, small_peak = _work(10)
    large_visits, large_evals, large_peak = _work(100)
    # Linear work: node visits per node stay flat (a quadratic pass would grow 10x here).
    assert large_visits <= 1.2 * small_visits, (small_visits, large_visits)
    assert small_evals == large_evals == 5
    # Each layer's intermediates are freed after their last folded use.
    assert small_peak == large_peak
