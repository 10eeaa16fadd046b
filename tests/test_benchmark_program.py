"""``python -m benchmarks --program PATH.pt2`` (`benchmarks.saved_program`): a program saved with
``torch.export.save`` gets the rows a built-in model gets, through the same units, verdict and
report; bad files stop the run with one line (exit status 2). CPU backends here; the QNN rows
and the README's section in tests/qnn/test_benchmark_program_qnn.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import models, runner, saved_program, verdict
from benchmarks.__main__ import main, parse_args

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("none", "constant_prop_pass", "fold_constants")


class ConvNet(torch.nn.Module):
    """conv -> batch norm -> relu -> mean -> linear: the batch norm's eval-mode scale and shift
    are constant-only (the fold stores them once)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.bn.running_mean.copy_(torch.randn(8, generator=g) * 0.1)
        self.bn.running_var.copy_(torch.rand(8, generator=g) + 0.5)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class ScaledLinear(torch.nn.Module):
    """``linear(x) * (2 * scale + 1)``: a constant-only scale beside a runtime linear."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.register_buffer("scale", torch.arange(float(d)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * (self.scale * 2 + 1)


def save(tmp_path: Path, name: str, module: torch.nn.Module, inputs, **export_kwargs) -> Path:
    torch.manual_seed(0)
    path = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(module.eval(), inputs, **export_kwargs), path)
    return path


def run(tmp_path: Path, *argv: str) -> list:
    out = tmp_path / "out"
    assert main([*argv, "--jobs", "1", "--runs", "1", "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


def assert_judged(row: dict) -> None:
    """The row built, ran and was judged against eager at its precision's tolerance."""
    assert row["status"].startswith("ok"), row.get("traceback") or row["status"]
    assert row["pte_bytes"] > 0 and row["eager_max_abs"] > verdict.MIN_SCALE
    assert row["tolerance"] == pytest.approx(verdict.RTOL[row["precision"]] * row["eager_max_abs"])
    assert row["max_abs_diff"] <= row["tolerance"]


def test_a_saved_conv_net_gets_every_cpu_row_named_after_its_file(tmp_path):
    torch.manual_seed(0)
    path = save(tmp_path, "convnet", ConvNet(), (torch.randn(1, 3, 16, 16),))
    # constant_prop_pass's rows too in the README's run (tests/qnn/test_benchmark_program_qnn.py)
    result = run(tmp_path, "--program", str(path), "--backends", "portable,xnnpack", "--variants", "none,fold_constants")
    rows = result["rows"]
    assert [(r["model"], r["backend"], r["variant"]) for r in rows] == [
        ("convnet", b, v) for b in ("portable", "xnnpack") for v in ("none", "fold_constants")]
    for row in rows:
        assert_judged(row)
        assert row["precision"] == "fp32" and row["latency_ms"] > 0
    by = {(r["backend"], r["variant"]): r for r in rows}
    for backend in ("portable", "xnnpack"):  # the batch norm's scale and shift folded
        assert by[backend, "fold_constants"]["pte_bytes"] < by[backend, "none"]["pte_bytes"]
    assert result["meta"]["programs"] == f"convnet = {path} (the program's example inputs)"
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| convnet | fold_constants | xnnpack | fp32 | ok |" in md


def test_a_saved_program_builds_the_rows_of_the_built_in_model_it_was_exported_from(tmp_path, monkeypatch):
    """Same units, same code: a saved export of a built-in model's module gives that model's
    `.pte` bytes, statuses and differences (the slow tier: resnet18 on XNNPACK through the CLI)."""
    torch.manual_seed(0)
    module, inputs = ConvNet().eval(), (torch.randn(1, 3, 16, 16),)
    monkeypatch.setitem(models.BUILDERS, "convnet", lambda quick=False: models.ModelSpec("convnet", module, inputs))
    spec = models.build("convnet")
    torch.export.save(runner.export_model(spec), tmp_path / "convnet.pt2")
    source = saved_program.ProgramSource("convnet", str(tmp_path / "convnet.pt2"))
    built = {}
    for kind, src in (("builtin", None), ("program", source)):
        work = tmp_path / kind
        work.mkdir()
        built[kind] = runner.build_unit(runner.Unit("convnet", ("fold_constants",), ("portable",),
                                                    False, str(work), source=src))
    for a, b in zip(built["builtin"], built["program"]):
        assert a.status == b.status == "ok", (a.traceback, b.traceback)
        assert Path(a.pte_path).read_bytes() == Path(b.pte_path).read_bytes()
        assert (a.max_abs_diff, a.const_bytes, a.aten_nodes, a.edge_nodes) == (
            b.max_abs_diff, b.const_bytes, b.aten_nodes, b.edge_nodes)


def test_a_dynamic_batch_dimension_takes_the_size_of_the_inputs(tmp_path):
    batch = torch.export.Dim("batch", max=32)
    path = save(tmp_path, "dynamic", ScaledLinear(), (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randn(5, 8, generator=torch.Generator().manual_seed(1)),), inputs)
    result = run(tmp_path, "--program", str(path), "--inputs", str(inputs), "--backends", "portable",
                 "--variants", "none,fold_constants")
    rows = result["rows"]
    assert [r["variant"] for r in rows] == ["none", "fold_constants"]
    for row in rows:
        assert_judged(row)
    assert rows[1]["pte_bytes"] < rows[0]["pte_bytes"]  # 2 * scale + 1 stored, not computed
    assert "dynamic dimensions at their sizes (5, 8)" in result["meta"]["programs"]
    spec = saved_program.ProgramSource("dynamic", str(path)).spec()  # without --inputs: its example size
    assert spec.inputs[0].shape == (3, 8) and not saved_program.has_dynamic_inputs(spec.program)


def test_a_program_saved_without_example_inputs_runs_on_random_ones_and_the_table_says_so(tmp_path):
    program = torch.export.export(ScaledLinear().eval(), (torch.randn(2, 8),))
    program.example_inputs = None
    torch.export.save(program, tmp_path / "bare.pt2")
    result = run(tmp_path, "--program", str(tmp_path / "bare.pt2"), "--backends", "portable", "--variants", "none")
    (row,) = result["rows"]
    assert_judged(row)
    assert row["note"] == saved_program.RANDOM_INPUTS_NOTE
    assert f"| bare | none | portable | fp32 | ok ({saved_program.RANDOM_INPUTS_NOTE}) |" in (
        tmp_path / "out" / "results.md").read_text()
    (x,) = saved_program.random_inputs(torch.export.load(tmp_path / "bare.pt2"))
    assert x.shape == (2, 8) and x.dtype == torch.float32


class TwoOutputs(torch.nn.Module):
    """``(linear(x) * (2 * scale + 1), argmax)``: a float and an integer output."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = ScaledLinear()

    def forward(self, x: torch.Tensor):
        y = self.inner(x)
        return y, y.argmax(-1)


def test_a_program_with_a_float_and_an_integer_output_is_judged_on_both(tmp_path):
    torch.manual_seed(0)
    path = save(tmp_path, "two_outputs", TwoOutputs(), (torch.randn(3, 8),))
    rows = run(tmp_path, "--program", str(path), "--backends", "portable", "--variants", "fold_constants")["rows"]
    (row,) = rows
    assert_judged(row)
    spec = saved_program.ProgramSource("two_outputs", str(path)).spec()
    with torch.no_grad():
        y, index = spec.module(*spec.inputs)
    assert row["eager_max_abs"] == float(y.abs().max())  # the float output's scale, not the indices'
    # the judge holds integer outputs to exact equality beside float ones
    wrong = runner.Row("two_outputs", "none", "portable", precision="fp32", max_abs_diff=0.0)
    assert runner.judge_cpu_row(wrong, [y, index], integer_mismatch=1 / 3).startswith("mismatch: 33.3 % of integer")


def test_an_already_quantized_program_is_judged_at_8a8w(tmp_path):
    """A program the user quantized (PT2E, XNNPACKQuantizer) is judged against its q/dq program
    at 8a8w's tolerance, as the built-in ``*_q8`` models are."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    inputs = (torch.randn(1, 3, 16, 16),)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(ConvNet().eval(), inputs).module(), quantizer)
    prepared(*inputs)
    path = tmp_path / "convnet_q.pt2"
    torch.export.save(torch.export.export(convert_pt2e(prepared), inputs), path)
    (row,) = run(tmp_path, "--program", str(path), "--backends", "portable", "--variants", "fold_constants")["rows"]
    assert row["precision"] == "8a8w"
    assert_judged(row)


def _edge_program(tmp_path: Path) -> Path:
    from executorch.exir import to_edge

    path = tmp_path / "edge.pt2"
    torch.export.save(to_edge(torch.export.export(ScaledLinear(), (torch.randn(2, 8),))).exported_program(), path)
    return path


def _two_methods(tmp_path: Path) -> Path:
    from torch.export.pt2_archive._package import package_pt2

    program = torch.export.export(ScaledLinear(), (torch.randn(2, 8),))
    path = tmp_path / "two.pt2"
    package_pt2(str(path), exported_programs={"forward": program, "decode": program})
    return path


def _inputs(tmp_path: Path, value) -> Path:
    path = tmp_path / "inputs.pt"
    torch.save(value, path)
    return path


BAD = {  # case -> (argv builder, what the error line says after the file's name)
    "missing file": (lambda t: ["--program", str(t / "nothing.pt2")], "no such file"),
    "not an archive": (lambda t: ["--program", str(_text(t))], "not a program saved with torch.export.save (not a .pt2 archive)"),
    "torch.save file": (lambda t: ["--program", str(_inputs(t, (torch.ones(2),)))], "saved with torch.save, not a program"),
    "several methods": (lambda t: ["--program", str(_two_methods(t))], "2 methods (forward, decode)"),
    "edge dialect": (lambda t: ["--program", str(_edge_program(t))], "an Edge-dialect program"),
    "inputs of another shape": (lambda t: ["--program", str(_good(t)), "--inputs", str(_inputs(t, (torch.ones(2, 9),)))],
                                "input 0 (x) has shape (2, 9), the program takes (2, 8)"),
    "inputs of another dtype": (lambda t: ["--program", str(_good(t)), "--inputs", str(_inputs(t, (torch.ones(2, 8, dtype=torch.int64),)))],
                                "input 0 (x) is torch.int64, the program takes torch.float32"),
    "too many inputs": (lambda t: ["--program", str(_good(t)), "--inputs", str(_inputs(t, (torch.ones(2, 8), torch.ones(1))))],
                        "2 tensors, the program takes 1 inputs (x)"),
    "inputs not tensors": (lambda t: ["--program", str(_good(t)), "--inputs", str(_inputs(t, {"x": 1}))],
                           "holds a dict, not a tuple of tensors"),
}


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.pt2"
    path.write_text("not a program")
    return path


def _good(tmp_path: Path) -> Path:
    return save(tmp_path, "good", ScaledLinear(), (torch.randn(2, 8),))


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_program_or_inputs_file_stops_the_run_with_one_line_naming_it(tmp_path, capsys, case):
    make, said = BAD[case]
    argv = make(tmp_path)
    capsys.readouterr()  # what saving the file printed
    assert main(argv + ["--backends", "portable", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    named = argv[-1]  # the file at fault: the inputs file, else the program
    assert len(err) == 1 and err[0].startswith("python -m benchmarks: error: ") and named in err[0], err
    assert said in err[0], err
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow  # the command in a subprocess (its imports: about 15 s); the in-process cases above pin the rule
def test_the_command_exits_2_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--program", str(_text(tmp_path)), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"python -m benchmarks: error: {tmp_path / 'notes.pt2'}: not a program saved with torch.export.save "
        "(not a .pt2 archive)")


def test_a_program_is_planned_like_a_built_in_model_and_the_default_runs_are_unchanged():
    source = saved_program.ProgramSource("convnet", "convnet.pt2")
    units = runner.plan_units(["convnet"], list(VARIANTS), list(runner.BACKENDS), False, "", {"convnet": source})
    assert sorted((u.backends, u.variants, u.precision) for u in units) == sorted(
        [(("portable", "xnnpack"), (v,), None) for v in VARIANTS] + [(("qnn",), VARIANTS, "fp16")])
    assert all(u.source is source for u in units)
    chosen = runner.plan_units(["convnet"], ["none"], ["qnn"], False, "", {"convnet": source}, ["8a8w", "16a4w"])
    assert [u.precision for u in chosen] == ["8a8w", "16a4w"]
    # a program's name may end like the XNNPACK-quantized models' and is still built for every backend
    assert runner.plan_units(["x_q8"], ["none"], ["qnn"], False, "", {"x_q8": source})
    args = parse_args(["--program", "a.pt2,b.pt2", "--program", "c.pt2", "--precisions", "fp16,8a8w"])
    assert (args.program, args.models, args.precisions) == (["a.pt2", "b.pt2", "c.pt2"], [], ["fp16", "8a8w"])
    with pytest.raises(SystemExit):
        parse_args(["--program", "a.pt2", "--precisions", "int4"])
    with pytest.raises(SystemExit):
        parse_args(["--inputs", "x.pt"])
    for argv in ([], ["--quick"]):  # without --program: the built-in models, no QNN precision chosen
        args = parse_args(argv)
        assert args.program == [] and args.precisions is None
        assert args.models == parse_args(argv + ["--models", ",".join(args.models)]).models


@pytest.mark.slow  # resnet18 (quick size) exported, saved and lowered for XNNPACK twice (about 40 s)
def test_a_saved_resnet18_gets_the_xnnpack_rows_of_models_resnet18(tmp_path):
    spec = models.build("resnet18", quick=True)
    torch.export.save(runner.export_model(spec), tmp_path / "resnet18.pt2")
    out = tmp_path / "out"
    assert main(["--quick", "--models", "resnet18", "--program", str(tmp_path / "resnet18.pt2"), "--backends", "xnnpack",
                 "--variants", "none,fold_constants", "--keep-pte", "--runs", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["resnet18"] * 2 + ["resnet18.pt2"] * 2  # named by its file name: resnet18 is taken
    for built_in, saved in zip(rows[:2], rows[2:]):
        assert built_in["status"] == saved["status"] == "ok"
        assert (built_in["pte_bytes"], built_in["max_abs_diff"]) == (saved["pte_bytes"], saved["max_abs_diff"])
        pte = f"__{built_in['variant']}__xnnpack.pte"
        assert (out / "pte" / f"resnet18{pte}").read_bytes() == (out / "pte" / f"resnet18.pt2{pte}").read_bytes()
