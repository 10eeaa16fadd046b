"""``python -m benchmarks --program PATH.pt2`` on the real HTP backend: a saved program's QNN rows
(fp16 from the float program; 8a8w and 16a4w through QnnQuantizer calibrated on its inputs),
judged like a built-in model's, a row QNN refuses beside rows that still build, and README's
"Your own model" section run as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import verdict
from benchmarks.__main__ import main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
STRANDED = "was not decomposed or delegated"


class ErfOfTable(torch.nn.Module):
    """README's model: ``proj(x) + erf(proj(table))``. QNN takes the constant-only
    ``proj(table)`` but not the erf after it (no QNN builder); HTP refuses that partition (no
    runtime input) and the linear, kept whole for QNN, cannot run on the CPU: fold off does not
    lower. The portable and XNNPACK rows lower either way."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.register_buffer("table", torch.randn(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.erf(self.proj(self.table))


class LinearStack(torch.nn.Module):
    """Three linears with relus: what QnnQuantizer quantizes (per-channel weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def save(tmp_path: Path, name: str, module: torch.nn.Module, inputs) -> Path:
    path = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(module.eval(), inputs), path)
    return path


def run(tmp_path: Path, *argv: str) -> list:
    out = tmp_path / "out"
    assert main([*argv, "--jobs", "1", "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["rows"]


def assert_judged(row: dict) -> None:
    """Built, run on the emulated HTP and judged against eager at the precision's tolerance, and
    (a row that folds) against the fold-off row's HTP output."""
    assert row["status"].startswith("ok"), row.get("traceback") or row["status"]
    assert row["partitions"] >= 1 and row["pte_bytes"] > row["context_binary_bytes"] > 0
    assert row["tolerance"] == pytest.approx(verdict.RTOL[row["precision"]] * row["eager_max_abs"])
    assert row["max_abs_diff"] <= row["tolerance"]
    if row["variant"] != "none" and row.get("vs_off_max_abs_diff") is not None:
        assert row["vs_off_max_abs_diff"] <= row["tolerance"]


def test_a_saved_program_gets_fp16_rows_and_a_row_qnn_refuses_leaves_the_others(tmp_path):
    torch.manual_seed(0)
    path = save(tmp_path, "erf_of_table", ErfOfTable(), (torch.randn(4, 16),))
    rows = run(tmp_path, "--program", str(path), "--backends", "qnn", "--variants", "none,fold_constants")
    off, on = rows
    assert [(r["model"], r["backend"], r["precision"], r["variant"]) for r in rows] == [
        ("erf_of_table", "qnn", "fp16", v) for v in ("none", "fold_constants")]
    assert off["status"].startswith("error (lower): RuntimeError: ") and STRANDED in off["status"], off["status"]
    assert_judged(on)
    assert on["cpu_ops"] == {}  # the constant branch, erf included, computed ahead of time
    assert on["fold_bytes_after"] is not None and on["note"] is None  # the fold lifted it


def test_a_saved_program_gets_the_qnn_row_of_the_built_in_model_it_was_exported_from(tmp_path, monkeypatch):
    """Same unit, same code: a saved export of a built-in model's module lowers for HTP to that
    model's row: the same `.pte` and context-binary sizes, partitions, folded bytes and HTP
    output (the rows do not keep the `.pte` itself)."""
    from benchmarks import models, qnn_unit, runner, saved_program

    torch.manual_seed(0)
    module, inputs = ErfOfTable().eval(), (torch.randn(4, 16),)
    monkeypatch.setitem(models.BUILDERS, "erf_of_table", lambda quick=False: models.ModelSpec("erf_of_table", module, inputs))
    torch.export.save(runner.export_model(models.build("erf_of_table")), tmp_path / "erf_of_table.pt2")
    source = saved_program.ProgramSource("erf_of_table", str(tmp_path / "erf_of_table.pt2"))
    (built_in,), (saved,) = (qnn_unit.build_unit("erf_of_table", ["fold_constants"], "fp16", False, src)
                             for src in (None, source))
    assert built_in.status == saved.status == "ok", (built_in.traceback, saved.traceback)
    for field in ("pte_bytes", "context_binary_bytes", "partitions", "cpu_ops", "max_abs_diff", "eager_max_abs",
                  "constant_bytes_in_partitions", "fold_bytes_after"):
        assert getattr(built_in, field) == getattr(saved, field), field


def test_a_saved_linear_stack_is_quantized_for_htp_on_its_inputs(tmp_path):
    torch.manual_seed(0)
    path = save(tmp_path, "stack", LinearStack(), (torch.randn(4, 32),))
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randn(4, 32, generator=torch.Generator().manual_seed(7)),), inputs)
    rows = run(tmp_path, "--program", str(path), "--inputs", str(inputs), "--backends", "qnn",
               "--precisions", "8a8w", "--variants", "none,fold_constants")
    assert [(r["precision"], r["variant"]) for r in rows] == [("8a8w", "none"), ("8a8w", "fold_constants")]
    for row in rows:
        assert_judged(row)
        assert row["quantize_time_s"] > 0
    # against the converted q/dq program on the --inputs tensors: their output's scale
    assert rows[0]["eager_max_abs"] == rows[1]["eager_max_abs"]


@pytest.mark.slow  # 16a4w's unit beside 8a8w's (about 60 s); 8a8w's default-tier test pins the path
def test_a_saved_linear_stack_in_16a4w(tmp_path):
    torch.manual_seed(0)
    path = save(tmp_path, "stack", LinearStack(), (torch.randn(4, 32),))
    rows = run(tmp_path, "--program", str(path), "--backends", "qnn", "--precisions", "16a4w")
    assert [(r["precision"], r["variant"]) for r in rows] == [
        ("16a4w", v) for v in ("none", "constant_prop_pass", "fold_constants")]
    assert_judged(rows[0])
    assert_judged(rows[2])


def readme_blocks() -> tuple:
    """The python block and the command of README's "## Your own model"."""
    section = README.read_text().split("\n## Your own model\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
    (command,) = re.findall(r"^```\n(python -m benchmarks .*?)\n```$", section, flags=re.M)
    return code, command


@pytest.mark.slow  # every row, three backends (about 100 s); the tests above pin each rule
def test_readme_your_own_model_runs_as_written(tmp_path):
    code, command = readme_blocks()
    assert code.count("torch.export.") == 2
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        exec(compile(code, f"{README}:Your own model", "exec"), {"__name__": "readme_own_model"})  # noqa: S102
    finally:
        os.chdir(cwd)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "benchmarks"]
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / argv[argv.index("--out") + 1]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["model"], r["backend"], r["variant"]) for r in rows] == [
        ("my_model", b, v) for b in ("portable", "xnnpack", "qnn") for v in ("none", "constant_prop_pass", "fold_constants")]
    for row in rows:
        if row["backend"] == "qnn" and row["variant"] == "none":  # as the section says
            assert row["status"].startswith("error (lower)") and STRANDED in row["status"], row["status"]
            continue
        if row["backend"] == "qnn":
            assert_judged(row)
        else:
            assert row["status"] == "ok" and row["max_abs_diff"] <= row["tolerance"]
    md = (out / "results.md").read_text()
    assert "| my_model | fold_constants | qnn | fp16 | ok" in md and (out / "pte_size_change.png").is_file()
