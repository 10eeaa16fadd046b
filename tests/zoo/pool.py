"""Each zoo model in its own spawned process, one at a time, with a timeout.

A model whose process crashes, runs out of memory or exceeds the timeout loses only its own row,
and keeps the steps it finished: the worker writes its row to a JSON checkpoint after each step
(`tests.zoo.run`), and the parent reads that file whatever happened.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

# Step names (see tests.zoo.run.STEPS); kept here so that unpickling `_child` in a fresh
# worker imports nothing heavy before `_worker.init` points its stderr at the log.
STEPS = ("build", "export", "aten", "edge", "xnnpack", "qnn")


def _child(name: str, checkpoint: str, log_path: Optional[str], steps: Sequence[str],
           xnnpack_variants: Sequence[str]) -> None:
    """Worker entry point: log setup, one torch thread, no hub, the real QNN libraries (no SDK download); then the model."""
    from benchmarks import _worker

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import qnn  # noqa: F401  (finds the QNN libraries and sets QNN_SDK_ROOT: executorch downloads no SDK)

    _worker.init(log_path)
    from .run import run_model

    run_model(name, checkpoint, steps, xnnpack_variants=xnnpack_variants)


def run_one(name: str, timeout_s: float, log_path: Optional[str] = None, steps: Sequence[str] = STEPS,
            work_dir: Optional[str] = None,
            xnnpack_variants: Sequence[str] = ("none", "fold_constants", "constant_prop_pass")) -> Dict[str, Any]:
    """Run model `name` in a fresh spawned process; returns its row, never raises.

    When the process dies or times out, the row holds the steps finished so far and
    ``worker_error`` says what happened (``timeout after N s in step S`` / ``exit code C in step S``).
    """
    ctx = multiprocessing.get_context("spawn")
    fd, checkpoint = tempfile.mkstemp(prefix="zoo-", suffix=".json", dir=work_dir)
    os.close(fd)
    os.unlink(checkpoint)
    start = time.perf_counter()
    proc = ctx.Process(target=_child, args=(name, checkpoint, log_path, tuple(steps), tuple(xnnpack_variants)), daemon=True)
    proc.start()
    proc.join(timeout_s)
    timed_out = proc.is_alive()
    if timed_out:
        proc.kill()
        proc.join()
    row = _read(checkpoint)
    if row is None:
        from .run import new_row

        row = new_row(name)
    if os.path.exists(checkpoint):
        os.unlink(checkpoint)
    row.setdefault("worker_error", None)
    if timed_out:
        row["worker_error"] = f"timeout after {timeout_s:.0f} s in step {row.get('step')}"
    elif not row.get("done"):
        row["worker_error"] = f"worker died (exit code {proc.exitcode}) in step {row.get('step')}"
    if row.get("wall_time_s") is None or not row.get("done"):
        row["wall_time_s"] = time.perf_counter() - start
    return row


def _read(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_all(names: Sequence[str], timeout_s: float, log_path: Optional[str] = None,
            steps: Sequence[str] = STEPS,
            on_done: Callable[[int, Dict[str, Any]], None] = lambda i, row: None,
            xnnpack_variants: Sequence[str] = ("none", "fold_constants", "constant_prop_pass")) -> List[Dict[str, Any]]:
    """Every model in `names`, one after the other (`run_one`); ``on_done(index, row)`` after each."""
    rows = []
    for i, name in enumerate(names):
        row = run_one(name, timeout_s, log_path, steps, xnnpack_variants=xnnpack_variants)
        rows.append(row)
        on_done(i, row)
    return rows
