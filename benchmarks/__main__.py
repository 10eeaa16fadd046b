"""CLI: ``python -m benchmarks [--quick] [--models ...] [--variants ...] [--backends ...]``.

``python -m benchmarks --qnn [--models ...] [--quick] [--out DIR]``: the QNN rows instead
(`benchmarks.qnn_rows`).

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

from . import models, report, runner, variants


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
                    "on real models, for the portable and XNNPACK backends.")
    p.add_argument("--models", type=_csv, default=None,
                   help=f"comma-separated subset of: {','.join(models.BUILDERS)} "
                        f"(default: all; with --quick: {','.join(models.QUICK_MODELS)})")
    p.add_argument("--variants", type=_csv, default=None,
                   help=f"comma-separated subset of: {','.join(variants.VARIANTS)} "
                        f"(default: {','.join(variants.DEFAULT_VARIANTS)}; with --sweep: "
                        f"{','.join(variants.SWEEP_VARIANTS)})")
    p.add_argument("--sweep", action="store_true",
                   help="policy sweep: no folding / no limits / default policy / strict, per model")
    p.add_argument("--qnn", action="store_true",
                   help="QNN HTP rows instead (fp16 and 8a8w, fold off/on, per model; "
                        "benchmarks/qnn_rows.py); writes qnn.json and qnn.md")
    p.add_argument("--scale", action="store_true",
                   help="run the scale benchmark instead (python -m benchmarks.scale; see its --help)")
    p.add_argument("--weight-scale", action="store_true",
                   help="run the weight-scale benchmark instead (python -m benchmarks.weight_scale; see its --help)")
    p.add_argument("--backends", type=_csv, default=list(runner.BACKENDS),
                   help="comma-separated subset of: portable,xnnpack (default: both)")
    p.add_argument("--quick", action="store_true",
                   help="small models and inputs, fewer latency runs (about 3 minutes)")
    p.add_argument("--runs", type=int, default=None,
                   help="timed forward() calls per row, median reported (default 10; --quick 3)")
    p.add_argument("--latency-budget", type=float, default=None, metavar="SECONDS",
                   help="stop timing a row after this many seconds; rows whose first run is "
                        "slower report that single cold run (default 3; --quick 1)")
    p.add_argument("--jobs", type=int, default=2,
                   help="parallel build processes (export/fold/lower); timing is always serial")
    p.add_argument("--out", default=None,
                   help="output directory (default: results/<timestamp>[-quick])")
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
    if args.models is None:
        args.models = models.QUICK_MODELS if args.quick else models.DEFAULT_MODELS
    if args.qnn:
        from .qnn_rows import MODELS as qnn_models

        if args.models == models.DEFAULT_MODELS:
            args.models = qnn_models
        _check(args.models, qnn_models, "model for --qnn (QNN quantizes the float models itself)")
    _check(args.models, list(models.BUILDERS), "model")
    _check(args.variants, list(variants.VARIANTS), "variant")
    _check(args.backends, list(runner.BACKENDS), "backend")
    if args.runs is None:
        args.runs = 3 if args.quick else 10
    if args.latency_budget is None:
        args.latency_budget = 1.0 if args.quick else 3.0
    if args.out is None:
        suffix = ("-quick" if args.quick else "") + ("-sweep" if args.sweep else "") + ("-qnn" if args.qnn else "")
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
    if args.qnn:
        return _main_qnn(args, argv)
    import torch
    from tqdm import tqdm

    torch.set_num_threads(2)
    os.makedirs(args.out, exist_ok=True)
    work_dir = os.path.join(args.out, "pte") if args.keep_pte else tempfile.mkdtemp(prefix="bench-pte-")
    os.makedirs(work_dir, exist_ok=True)
    n_rows = len(args.models) * len(args.variants) * len(args.backends)
    bar = tqdm(total=2 * n_rows, desc="build", unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_step(phase: str, row: runner.Row) -> None:
        bar.set_description(phase)
        bar.set_postfix_str(f"{row.model}/{row.variant}/{row.backend}: {row.status[:40]}")
        bar.update(1)

    start = time.perf_counter()
    try:
        rows = runner.run_all(args.models, args.variants, args.backends, args.runs, work_dir,
                              quick=args.quick, jobs=args.jobs, latency_budget_s=args.latency_budget,
                              log_path=os.path.join(args.out, "workers.log"), on_step=on_step)
    finally:
        bar.close()
        if not args.keep_pte:
            shutil.rmtree(work_dir, ignore_errors=True)
    wall = time.perf_counter() - start
    meta = dict(_meta(args, argv, wall), runs=args.runs, latency_budget_s=args.latency_budget, jobs=args.jobs)
    dicts = [r.to_dict() for r in rows]
    paths = report.write_all(dicts, args.out, meta)
    print(report.to_markdown(dicts))
    failed = [r for r in rows if r.status != "ok"]
    print(f"{len(rows) - len(failed)}/{len(rows)} rows ok, wall time {wall:.0f} s; "
          f"wrote {', '.join(paths.values())}", file=sys.stderr)
    return 1 if failed else 0


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


def _main_qnn(args: argparse.Namespace, argv: Optional[List[str]]) -> int:
    """``--qnn``: one (model, precision) at a time in a worker process; print the table."""
    import qnn

    from . import qnn_rows

    os.makedirs(args.out, exist_ok=True)
    sdk = qnn.load_qnn_sdk()  # QnnSdkError (what to install) before any worker starts
    sdk_text = f"QNN {sdk.build_id} ({sdk.source})"

    def on_done(row: dict) -> None:
        print(f"{row['model']}/{row['precision']}/{row['mode']}: "
              f"{row['status'][:80]} ({row['wall_time_s'] or 0:.0f} s)", file=sys.stderr)

    start = time.perf_counter()
    rows = qnn_rows.run_all(args.models, quick=args.quick, log_path=os.path.join(args.out, "workers.log"),
                            on_done=on_done)
    wall = time.perf_counter() - start
    meta = dict(_meta(args, argv, wall), soc=qnn_rows.SOC_NAME, qnn_sdk=sdk_text, qnn_sdk_root=sdk.root)
    paths = qnn_rows.write_all(rows, args.out, meta, sdk_text)
    print(qnn_rows.to_markdown(rows, sdk_text))
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} rows ok, wall time {wall:.0f} s; wrote {', '.join(paths.values())}", file=sys.stderr)
    # a fold-off or constant_prop_pass row may fail by design (stranded constant-only op); a
    # fold-on failure is a bug unless fold off fails at the same stage (QNN refuses the model)
    return 1 if qnn_rows.regressions(rows) else 0


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
