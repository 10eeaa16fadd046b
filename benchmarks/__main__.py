"""CLI: ``python -m benchmarks [--quick] [--models ...] [--variants ...] [--backends portable,xnnpack,qnn]``.

``python -m benchmarks --program PATH.pt2 [--inputs PATH.pt] [--precisions fp16,8a8w,16a4w]``: the
same rows for a program saved with ``torch.export.save`` (`benchmarks.saved_program`), named after
its file; with ``--models`` too, both. A bad file or inputs file: one line on stderr, exit status 2.

QNN/HTP is a backend of the run (on by default; `benchmarks.qnn_unit`); ``--qnn`` is short for
``--backends qnn``.

``python -m benchmarks --weight-scale [--quick] [--out DIR] [options of benchmarks.weight_scale]``:
fold_constants vs constant_prop_pass on 0.5-4 GiB Llama programs instead (`benchmarks.weight_scale`).

``python -m benchmarks --fold-time [--quick] [--models ...] [--repeats N] [--out DIR]``: the fold
stage's time against constant_prop_pass's on the default models, side by side
(`benchmarks.fold_time`).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import List, Optional

from . import models, progress, report, runner, variants


def _csv(value: str) -> List[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _check(names: List[str], allowed, what: str) -> List[str]:
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})")
    return names


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Compare no folding, ExecuTorch constant_prop_pass and fold_constants "
                    "on real models, for the portable, XNNPACK and QNN/HTP backends.")
    p.add_argument("--models", type=_csv, default=None,
                   help=f"comma-separated subset of: {','.join(models.BUILDERS)} "
                        f"(default: all but swin_v2_t_q8; {','.join(models.QNN_ONLY_MODELS)} for qnn only; "
                        f"with --quick: {','.join(models.QUICK_MODELS)})")
    p.add_argument("--program", type=_csv, action="append", default=None, metavar="PATH.pt2",
                   help="a program saved with torch.export.save, benchmarked like a built-in model and "
                        "named after its file (repeatable, or comma-separated); without --models, only these")
    p.add_argument("--inputs", type=_csv, action="append", default=None, metavar="PATH.pt",
                   help="--program's inputs: a tuple of tensors saved with torch.save, for the run and for "
                        "QNN's calibration (default: the program's example inputs; random ones, said in the "
                        "table, when it was saved without); one for all programs or one per program")
    p.add_argument("--precisions", type=_csv, default=None,
                   help="QNN precisions, a subset of fp16,8a8w,16a4w (default: fp16 for --program; each "
                        "built-in model's own)")
    p.add_argument("--variants", type=_csv, default=None,
                   help=f"comma-separated subset of: {','.join(variants.VARIANTS)} "
                        f"(default: {','.join(variants.DEFAULT_VARIANTS)}; with --sweep: "
                        f"{','.join(variants.SWEEP_VARIANTS)})")
    p.add_argument("--sweep", action="store_true",
                   help="policy sweep: no folding / no limits / default policy / strict, per model")
    p.add_argument("--qnn", action="store_true",
                   help="short for --backends qnn: only the QNN/HTP rows")
    p.add_argument("--scale", action="store_true",
                   help="run the scale benchmark instead (python -m benchmarks.scale; see its --help)")
    p.add_argument("--weight-scale", action="store_true",
                   help="run the weight-scale benchmark instead (python -m benchmarks.weight_scale; see its --help)")
    p.add_argument("--backends", type=_csv, default=None,
                   help="comma-separated subset of: portable,xnnpack,qnn (default: all three; qnn rows "
                        "say 'skipped: <why>' where the QNN libraries are missing)")
    p.add_argument("--quick", action="store_true",
                   help="small models and inputs, one QNN precision per model, fewer latency runs (about 5 minutes)")
    p.add_argument("--runs", type=int, default=None,
                   help="timed forward() calls per row, median reported (default 10; --quick 3)")
    p.add_argument("--latency-budget", type=float, default=None, metavar="SECONDS",
                   help="stop timing a row after this many seconds; rows whose first run is "
                        "slower report that single cold run (default 3; --quick 1)")
    p.add_argument("--jobs", type=int, default=2,
                   help="parallel build processes (export/fold/lower); timing is always serial")
    p.add_argument("--out", default=None,
                   help="output directory (default: results/<timestamp>[-quick][-sweep][-qnn])")
    p.add_argument("--keep-pte", action="store_true", help="keep the .pte files in OUT/pte")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr (INFO)")
    p.add_argument("--fold-time", action="store_true",
                   help="time the fold stage against constant_prop_pass on the default models instead "
                        "(python -m benchmarks.fold_time; see its --help)")
    args, rest = p.parse_known_args(argv)
    args.scale_argv = rest
    if args.fold_time:  # its own options; --quick, --models and --out pass through
        args.fold_time_argv = (rest + (["--quick"] if args.quick else []) + (["--out", args.out] if args.out else [])
                               + (["--models", ",".join(args.models)] if args.models else []))
        return args
    if args.weight_scale:  # its own options (benchmarks.weight_scale.main); --quick and --out pass through
        args.weight_scale_argv = rest + (["--quick"] if args.quick else []) + (["--out", args.out] if args.out else [])
        return args
    if rest and not args.scale:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.variants is None:
        args.variants = variants.SWEEP_VARIANTS if args.sweep else variants.DEFAULT_VARIANTS
    if args.backends is None:
        args.backends = ["qnn"] if args.qnn else list(runner.BACKENDS)
    elif args.qnn and args.backends != ["qnn"]:
        p.error("--qnn is short for --backends qnn; give one of them")
    _check(args.backends, list(runner.BACKENDS), "backend")
    args.program = [path for group in args.program or [] for path in group]
    args.inputs = [path for group in args.inputs or [] for path in group]
    if args.inputs and not args.program:
        p.error("--inputs goes with --program")
    if args.precisions is not None:
        from .qnn_unit import ALL_PRECISIONS

        _check(args.precisions, list(ALL_PRECISIONS), "precision")
    if args.models is None and args.program:
        args.models = []
    if args.models is None:
        args.models = list(models.QUICK_MODELS if args.quick else models.DEFAULT_MODELS)
        if not args.quick and "qnn" in args.backends:
            args.models += models.QNN_ONLY_MODELS
        # only the models some chosen backend builds (e.g. no *_q8 rows with --backends qnn)
        args.models = [m for m in args.models if set(models.backends_of(m)) & set(args.backends)]
    _check(args.models, list(models.BUILDERS), "model")
    _check(args.variants, list(variants.VARIANTS), "variant")
    unbuilt = [m for m in args.models if not set(models.backends_of(m)) & set(args.backends)]
    if unbuilt:
        p.error(f"no row to build: {', '.join(unbuilt)} is built for "
                f"{' / '.join(','.join(models.backends_of(m)) for m in unbuilt)} only")
    if args.runs is None:
        args.runs = 3 if args.quick else 10
    if args.latency_budget is None:
        args.latency_budget = 1.0 if args.quick else 3.0
    if args.out is None:
        suffix = ("-quick" if args.quick else "") + ("-sweep" if args.sweep else "") + ("-qnn" if args.backends == ["qnn"] else "")
        args.out = os.path.join("results", time.strftime("%Y%m%d-%H%M%S") + suffix)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; print the Markdown table; write JSON, Markdown and PNG to ``--out``."""
    args = parse_args(argv)
    if args.scale:
        from . import scale

        return scale.main(args.scale_argv)
    if args.weight_scale:
        from . import weight_scale

        return weight_scale.main(args.weight_scale_argv)
    if args.fold_time:
        from . import fold_time

        return fold_time.main(args.fold_time_argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    import torch

    torch.set_num_threads(2)
    sources = []
    if args.program:
        from . import saved_program

        try:
            sources = saved_program.sources(args.program, args.inputs, taken=args.models)
        except saved_program.ProgramError as exc:
            print(f"python -m benchmarks: error: {exc}", file=sys.stderr)
            return 2
    by_name = {s.name: s for s, _ in sources}
    names = list(args.models) + list(by_name)
    os.makedirs(args.out, exist_ok=True)
    work_dir = os.path.join(args.out, "pte") if args.keep_pte else tempfile.mkdtemp(prefix="bench-pte-")
    os.makedirs(work_dir, exist_ok=True)
    shown = progress.Progress(runner.total_rows(names, args.variants, args.backends, args.quick, by_name, args.precisions))
    print(f"benchmark: {shown.total} rows ({', '.join(args.backends)}; {', '.join(names)}); "
          f"worker logs in {os.path.join(args.out, 'workers.log')}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        rows = runner.run_all(names, args.variants, args.backends, args.runs, work_dir,
                              quick=args.quick, jobs=args.jobs, latency_budget_s=args.latency_budget,
                              log_path=os.path.join(args.out, "workers.log"), on_step=shown.step,
                              on_building=shown.building, sources=by_name, precisions=args.precisions)
    finally:
        if not args.keep_pte:
            shutil.rmtree(work_dir, ignore_errors=True)
    wall = time.perf_counter() - start
    meta = dict(_meta(args, argv, wall), runs=args.runs, latency_budget_s=args.latency_budget, jobs=args.jobs)
    if sources:
        from .saved_program import describe

        meta["programs"] = describe(sources)
    dicts = [r.to_dict() for r in rows]
    from .qnn_unit import regressions, sdk_text

    if any(r["backend"] == "qnn" for r in dicts):
        meta["qnn"] = sdk_text(dicts) or "not loaded (rows skipped)"
    paths = report.write_all(dicts, args.out, meta)
    print(report.to_markdown(dicts))
    print(_summary(dicts, wall, paths), file=sys.stderr)
    return 1 if failures(dicts, regressions) else 0


def failures(rows: List[dict], qnn_regressions) -> List[dict]:
    """Rows that make the run fail: a CPU row not ``ok`` (skips excepted), and a QNN
    ``fold_constants`` row that failed where ``none`` did not (`qnn_unit.regressions`). A QNN
    ``none`` or ``constant_prop_pass`` row may fail by design (a partition without runtime input)."""
    cpu = [r for r in rows if r["backend"] != "qnn" and r["status"] != "ok" and not r["status"].startswith("skipped")]
    return cpu + qnn_regressions(rows)


def _summary(rows: List[dict], wall: float, paths: dict) -> str:
    ok = sum(r["status"] == "ok" for r in rows)
    skipped = sum(r["status"].startswith("skipped") for r in rows)
    return (f"{ok}/{len(rows)} rows ok" + (f", {skipped} skipped" if skipped else "")
            + f", wall time {wall:.0f} s; wrote {', '.join(paths.values())}")


def _meta(args: argparse.Namespace, argv: Optional[List[str]], wall: float) -> dict:
    """The run's command, times, versions and machine, for the results' header."""
    import torch

    return {
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv),
        "wall_time_s": round(wall, 1),
        "cpu_time_s": round(_cpu_time(), 1),
        "quick": args.quick, "torch": torch.__version__,
        "executorch": _version("executorch"), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _cpu_time() -> float:
    """User+system CPU seconds of this process and its (reaped) worker processes."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
