"""``python -m tests.zoo [--models a,b|tv/|hf/] [--timeout S] [--out DIR] [--steps ...]``.

The full zoo writes the generated block of ``docs/zoo.md`` and ``docs/zoo.json``; a subset
(``--models``) writes ``zoo.md`` and ``zoo.json`` to ``--out`` (default ``results/<time>-zoo``)
and leaves ``docs/`` alone. Prints one line per model on stderr as it finishes, the table on stdout.
Exit status 1 when a row fails a ``fold_constants`` check.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from . import report, verdict
from .models import TV_MAX_PARAMS, zoo_names
from .pool import STEPS

DOC_MD = os.path.join("docs", "zoo.md")
DOC_JSON = os.path.join("docs", "zoo.json")
DEFAULT_TIMEOUT_S = 600.0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.zoo",
                                description="Model-zoo conformance of fold_constants (and constant_prop_pass).")
    p.add_argument("--models", default=None,
                   help="comma-separated model names or prefixes (tv/, tvseg/, hf/, hf/gpt2 ...); default: all")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per model (default 600)")
    p.add_argument("--steps", default=",".join(STEPS[2:]),
                   help=f"comma-separated subset of {','.join(STEPS[2:])} (export always runs)")
    p.add_argument("--cpp-pte", action="store_true",
                   help="also lower and run the constant_prop_pass .pte (XNNPACK; about +15 s per model)")
    p.add_argument("--out", default=None, help="output directory (default: docs/ for the full zoo, "
                                               "results/<time>-zoo for a subset)")
    p.add_argument("--list", action="store_true", help="print the zoo's model names and exit")
    p.add_argument("--render", metavar="JSON", default=None,
                   help="do not run: rewrite the Markdown next to JSON (docs/zoo.json -> docs/zoo.md) from its rows")
    args = p.parse_args(argv)
    names = zoo_names(extra=bool(args.models))
    if args.models:
        wanted = [w.strip() for w in args.models.split(",") if w.strip()]
        picked = [n for n in names if any(n == w or (w.endswith("/") and n.startswith(w)) for w in wanted)]
        unknown = [w for w in wanted if not any(n == w or (w.endswith("/") and n.startswith(w)) for n in names)]
        if unknown:
            p.error(f"unknown zoo models: {', '.join(unknown)} (see --list)")
        args.names, args.full = picked, False
    else:
        args.names, args.full = zoo_names(), True
    args.steps = [s for s in args.steps.split(",") if s]
    bad = [s for s in args.steps if s not in STEPS[2:]]
    if bad:
        p.error(f"unknown steps: {', '.join(bad)}")
    if args.out is None:
        args.out = "docs" if args.full else os.path.join("results", time.strftime("%Y%m%d-%H%M%S") + "-zoo")
    return args


def _progress(total: int, start: float, partial_path: Optional[str] = None):
    """One line per finished model on stderr; the rows so far to `partial_path` (JSON lines)."""
    if partial_path and os.path.exists(partial_path):
        os.unlink(partial_path)

    def on_done(i: int, row: Dict[str, Any]) -> None:
        if partial_path:
            import json

            with open(partial_path, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
        elapsed = time.perf_counter() - start
        eta = elapsed / (i + 1) * (total - i - 1)
        print(f"[{i + 1:>2}/{total}] {row['model']:<40} {verdict.status(row)[:90]}  "
              f"({row.get('wall_time_s') or 0:.0f} s; elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min)",
              file=sys.stderr, flush=True)
    return on_done


def meta(argv: Optional[Sequence[str]], wall: float) -> Dict[str, Any]:
    """Command, date, wall time, versions, machine and git commit of the run."""
    from importlib.metadata import version

    import qnn

    sdk = qnn.try_load_qnn_sdk()
    def v(dist: str) -> str:
        try:
            return version(dist)
        except Exception:  # noqa: BLE001
            return "?"

    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=False).stdout.strip() or "?"
    except OSError:
        git = "?"
    return {
        "command": "python -m tests.zoo " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"), "wall_time_s": round(wall), "git": git,
        "torch": v("torch"), "executorch": v("executorch"), "torchvision": v("torchvision"),
        "transformers": v("transformers"), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "qnn_sdk": f"QNN {sdk.build_id} ({sdk.source})" if sdk else "absent", "tv_max_params": TV_MAX_PARAMS,
    }


def render(json_path: str) -> int:
    """Rewrite the generated block of the Markdown beside `json_path` from the rows it holds."""
    import json

    with open(json_path) as f:
        data = json.load(f)
    md = os.path.splitext(json_path)[0] + ".md"
    report.write_json(data["rows"], data["meta"], json_path)  # refresh the summary with today's checks
    report.write_doc(data["rows"], data["meta"], md)
    print(f"wrote {md}", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the zoo (each model in its own process), print the table, write Markdown and JSON."""
    from .pool import run_all

    args = parse_args(argv)
    if args.render:
        return render(args.render)
    if args.list:
        print("\n".join(args.names))
        return 0
    os.makedirs(args.out, exist_ok=True)
    log_dir = os.path.join("results", "zoo-logs") if args.full else args.out
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, "workers.log")
    print(f"zoo: {len(args.names)} models, one process each, timeout {args.timeout:.0f} s; "
          f"worker log {log_path}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    variants = ("none", "fold_constants") + (("constant_prop_pass",) if args.cpp_pte else ())
    rows = run_all(args.names, args.timeout, log_path, ["export", *args.steps], _progress(len(args.names), start, os.path.join(log_dir, "rows.partial.jsonl")),
                   xnnpack_variants=variants)
    wall = time.perf_counter() - start
    info = meta(argv, wall)
    md = DOC_MD if args.full and args.out == "docs" else os.path.join(args.out, "zoo.md")
    js = DOC_JSON if args.full and args.out == "docs" else os.path.join(args.out, "zoo.json")
    report.write_json(rows, info, js)
    report.write_doc(rows, info, md)
    print(report.block(rows, info))
    failed = [r for r in rows if verdict.problems(r)]
    print(f"{len(rows) - len(failed)}/{len(rows)} rows pass; wall {wall / 60:.1f} min; wrote {md}, {js}",
          file=sys.stderr)
    return 1 if failed else 0
