"""The benchmark's command line (`benchmarks/__main__.py`): QNN is a backend of the main run,
and a machine without the QNN libraries gets ``skipped`` QNN rows and a run that succeeds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import runner
from benchmarks.__main__ import parse_args

REPO = Path(__file__).resolve().parents[1]


def test_qnn_is_a_default_backend_and_quick_builds_every_quick_model_for_it():
    args = parse_args(["--quick"])
    assert args.backends == ["portable", "xnnpack", "qnn"]
    units = runner.plan_units(args.models, args.variants, args.backends, True, "")
    qnn = {(u.model, u.precision): u.variants for u in units if u.is_qnn}
    assert qnn == {("resnet18", "fp16"): ("none", "constant_prop_pass", "fold_constants"),
                   ("llama", "fp16"): ("none", "constant_prop_pass", "fold_constants"),
                   ("t5_encoder", "8a8w"): ("none", "constant_prop_pass", "fold_constants")}
    assert runner.total_rows(args.models, args.variants, args.backends, True) == 3 * 3 * 2 + 3 * 3


def test_the_full_run_adds_the_llm_scale_model_for_qnn_only():
    args = parse_args([])
    assert "llama_1b" in args.models and "mobilenet_v3_small_q8" in args.models
    units = runner.plan_units(args.models, args.variants, args.backends, False, "")
    assert {(u.backends, u.precision) for u in units if u.model == "llama_1b"} == {(("qnn",), "16a4w")}
    assert {u.backends for u in units if u.model == "mobilenet_v3_small_q8"} == {("portable", "xnnpack")}
    assert units[0].model == "llama_1b"  # slowest first
    assert "llama_1b" not in parse_args(["--backends", "portable,xnnpack"]).models


def test_qnn_flag_is_short_for_backends_qnn():
    args = parse_args(["--qnn"])
    assert args.backends == ["qnn"] and "mobilenet_v3_small_q8" not in args.models
    assert args.out.endswith("-qnn")
    with pytest.raises(SystemExit):
        parse_args(["--models", "llama_1b", "--backends", "portable"])


@pytest.mark.slow  # a whole benchmark run in a subprocess (about 20 s)
def test_without_qnn_libraries_the_qnn_rows_say_skipped_and_the_run_succeeds(tmp_path):
    """An SDK root without libraries stands for a machine where the qnn extra cannot install."""
    empty, out = tmp_path / "no-sdk", tmp_path / "out"
    empty.mkdir()
    env = dict(os.environ, QNN_SDK_ROOT=str(empty), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--backends", "qnn", "--models", "resnet18",
                           "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["backend"], r["precision"], r["variant"]) for r in rows] == [
        ("qnn", "fp16", v) for v in ("none", "constant_prop_pass", "fold_constants")]
    for r in rows:
        assert r["status"].startswith(f"skipped: QNN_SDK_ROOT={empty} has no libQnnHtp.so"), r["status"]
    assert "skipped: QNN_SDK_ROOT=" in (out / "results.md").read_text()
    assert "0/3 rows ok, 3 skipped" in proc.stderr
    assert "building resnet18" not in proc.stderr  # nothing was built
    assert (out / "pte_size_change.png").is_file() and (out / "qnn_cpu_ops.png").is_file()


def test_cpu_ratio_prints_the_fold_against_one_evaluation(capsys):
    from benchmarks import cpu_ratio

    assert cpu_ratio.main(["--dialect", "ATEN", "--layers", "20", "--repeat", "1", "--budget"]) == 0
    ratio, budget, phases, prices = capsys.readouterr().out.strip().splitlines()[-4:]
    assert ratio.startswith("ATEN nodes 182 ") and ratio.count("x)") == 2, ratio
    assert budget.startswith("floor ") and "1.5x leaves" in budget and ("x the budget)" in budget or "no budget left" in budget), budget
    named = dict(p.rsplit(" ", 1) for p in phases.split(": ", 1)[1].split("; ")[0].split(", "))
    assert {"analysis", "lift"} <= named.keys() and "evaluation" not in named, phases
    assert prices.startswith("price per pass over 182 nodes"), prices


def test_scale_measures_the_fold_beside_one_evaluation_its_floor_and_constant_prop_pass():
    # `_measure` in this process (the CLI runs it in a spawned one per method; spawning two
    # costs ~10 s of imports for nothing the test checks).
    from benchmarks import scale

    class Rows(list):
        put = list.append

    rows = Rows()
    for method in ("fold_constants", "constant_prop_pass"):
        scale._measure(method, 22, "ATEN", 1, rows)
    fold = next(r for r in rows if r["method"] == "fold_constants")
    assert fold["nodes"] == rows[1]["nodes"] > 150
    assert fold["interpreter_s"] > 0 and fold["floor_s"] > 0 and fold["folded"] > 0
    assert 0 <= fold["peak_rss_growth_kib"] < 16 * 1024, fold  # a 200-node program: a few MiB at most
    table = scale.growth_table(rows)
    assert table[2].startswith(f"| ATEN | {fold['nodes']:,} | ") and "| 0.1 |" in table[2], table[:3]


def test_own_peak_growth_sees_what_a_run_holds_at_its_peak():
    # In a fresh process, as `benchmarks.scale` measures: in this one, memory an earlier test
    # freed may still be resident, and a new allocation reuses it without raising the RSS.
    code = (
        "import torch\n"
        "from benchmarks.scale import own_peak_growth\n"
        "def peak_of_64_mib():\n"
        "    t = torch.ones(16 * 1024 * 1024)  # 64 MiB, written: resident\n"
        "    del t\n"
        "print(own_peak_growth(peak_of_64_mib), own_peak_growth(lambda: None))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.split()
    held, nothing = int(out[-2]), int(out[-1])
    assert held >= 60 * 1024 * 1024, out
    assert nothing < 8 * 1024 * 1024, out


def _help(main, capsys) -> str:
    with pytest.raises(SystemExit):
        main(["--help"])
    return capsys.readouterr().out


def test_every_documented_benchmark_command_uses_flags_its_module_has(capsys):
    """Each ``python -m benchmarks[.module] ...`` command in docs/benchmarks.md and README names only
    flags that module's ``--help`` lists (a benchmark run by ``--scale``, ``--weight-scale`` or
    ``--fold-time`` also takes that benchmark's flags)."""
    from benchmarks import cpu_ratio, fold_time, lowering_memory, scale, weight_scale

    helps = {name: _help(mod.main, capsys) for name, mod in
             {"scale": scale, "weight_scale": weight_scale, "fold_time": fold_time,
              "cpu_ratio": cpu_ratio, "lowering_memory": lowering_memory}.items()}
    helps[""] = _help(parse_args, capsys)
    runs = {"--scale": "scale", "--weight-scale": "weight_scale", "--fold-time": "fold_time"}
    text = (REPO / "docs" / "benchmarks.md").read_text() + (REPO / "README.md").read_text()
    commands = re.findall(r"python -m benchmarks(?:\.(\w+))?((?:(?:[ \t]+|[ \t]*\n[ \t]*(?=[-\[]))[^`\s#]+)*)", text)
    assert len(commands) > 20, commands
    for module, args in commands:
        flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args))
        allowed = helps[module] + "".join(helps[runs[f]] for f in flags if not module and f in runs)
        unknown = {f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", allowed)}
        assert not unknown, f"python -m benchmarks{'.' + module if module else ''}{args}: {sorted(unknown)}"


def test_the_documented_flag_defaults_are_the_parsers():
    """docs/benchmarks.md, "Running": the flag table's defaults (``off``, a number, or ``N (quick M)``)."""
    table = (REPO / "docs" / "benchmarks.md").read_text().split("| flag | default | meaning |", 1)[1].split("\n\n", 1)[0]
    full, quick = vars(parse_args([])), vars(parse_args(["--quick"]))
    checked = 0
    for flag, default in re.findall(r"^\| `(-[-\w]+)[^`]*` \| ([^|]+) \|", table, re.M):
        key = "verbose" if flag == "-v" else flag.lstrip("-").replace("-", "_")
        number = re.fullmatch(r"([0-9.]+)(?: \(quick ([0-9.]+)\))?", default.strip())
        if default.strip() == "off":
            assert full[key] is False, flag
        elif number:
            assert full[key] == float(number.group(1)), flag
            assert quick[key] == float(number.group(2) or number.group(1)), flag
        elif flag == "--backends":
            assert ",".join(full[key]) == default.strip().strip("`"), flag
        else:
            continue
        checked += 1
    assert checked >= 10, table
