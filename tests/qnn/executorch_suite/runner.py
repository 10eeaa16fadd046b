"""The differential run: each selected suite test, stock then fold, classified and written out
after every test (so an interrupted run leaves its results so far, and ``resume`` continues it).
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from importlib import metadata
from typing import Callable, Dict, List, Optional, Sequence

from .classify import classify
from .pool import REPO_ROOT, Worker
from .report import write_json, write_markdown
from .suite import CLASSES, SOC_MODEL
from .variants import VARIANTS


def _git(root: str, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _product_commit(root: str) -> str:
    """The last commit that touched folding/ or qnn/ (what the run measures), with ``+dirty``
    when the working tree changes them (each new worker imports the working tree)."""
    commit = _git(root, "log", "-1", "--format=%h", "--", "folding", "qnn")
    dirty = bool(_git(root, "status", "--porcelain", "--", "folding", "qnn"))
    return f"{commit}+dirty" if commit and dirty else commit


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def describe_environment(product_root: Optional[str]) -> Dict:
    """What the run measured: the product commit (and whether folding/ or qnn/ had local
    changes), the package versions, the SoC."""
    root = product_root or REPO_ROOT
    return {
        "commit": _git(root, "rev-parse", "--short", "HEAD"),
        "product_commit": _product_commit(root),
        "dirty": bool(_git(root, "status", "--porcelain", "--", "folding", "qnn")),
        "product_root": os.path.abspath(root),
        "executorch": metadata.version("executorch"),
        "torch": metadata.version("torch"),
        "soc_model": SOC_MODEL,
        "variants": list(VARIANTS),
    }


def run(
    *,
    classes: Sequence[str] = CLASSES,
    match: Optional[str] = None,
    limit: Optional[int] = None,
    timeout: float = 900.0,
    json_path: str,
    markdown_path: Optional[str] = None,
    log_path: str,
    product_root: Optional[str] = None,
    resume: bool = False,
    recycle: int = 25,
    stop_file: Optional[str] = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Dict:
    """Run the selected tests both ways on the real backend and write the results.

    Args:
        classes, match, limit: the selection (`suite.list_tests`).
        timeout: seconds one (test, variant) may take before its worker is killed.
        json_path, markdown_path: where the results go, rewritten after every test.
        log_path: the worker's output (executorch and QNN logs), appended.
        product_root: the checkout whose ``folding``/``qnn`` are measured (None: as installed).
        resume: keep the tests already in `json_path` and run only the others.
        recycle: a fresh worker after this many tests.
        stop_file: when this file exists, stop between two tests (the results so far are
            written; ``resume`` continues), so the run can give the machine back for a while.

    Returns:
        ``{"meta", "results"}``, as written to `json_path`.
    """
    import json

    previous: Dict[str, Dict] = {}
    sessions: List[Dict] = []
    if resume and os.path.exists(json_path):
        with open(json_path) as f:
            saved = json.load(f)
        previous = {r["test"]: r for r in saved["results"]}
        old = saved["meta"]
        sessions = old.get("sessions") or [{"started": old.get("started"), "commit": old.get("commit"),
                                            "product_commit": old.get("product_commit", ""),
                                            "dirty": old.get("dirty"), "tests": len(previous),
                                            "seconds": old.get("seconds")}]
    meta = describe_environment(product_root)
    root = product_root or REPO_ROOT
    session = {"started": _now(), "commit": meta["commit"], "product_commit": meta["product_commit"],
               "dirty": meta["dirty"], "tests": 0, "seconds": 0}
    sessions.append(session)
    meta.update(started=sessions[0]["started"], sessions=sessions, classes=list(classes), match=match,
                limit=limit, timeout=timeout)
    start = time.monotonic()
    results: List[Dict] = []
    with Worker(log_path, product_root, recycle) as worker:
        tests = worker.list_tests(classes, match, limit)
        meta.update(selected=len(tests), qnn_build_id=worker.info.get("qnn_build_id"))
        selected = set(tests)
        unselected = [r for t, r in previous.items() if t not in selected]  # kept in the file as they are
        for index, test_id in enumerate(tests, 1):
            if test_id in previous:
                results.append(previous[test_id])
                continue
            if stop_file and os.path.exists(stop_file):
                progress(f"stopping before {test_id}: {stop_file} exists (continue with --resume)")
                results += [previous[t] for t in tests[index:] if t in previous]  # kept, not rerun
                break
            records = {variant: worker.run(test_id, variant, timeout) for variant in VARIANTS}
            worker.finished_test()
            result = {"test": test_id, "product_commit": _product_commit(root),
                      **classify(records["stock"], records["fold"]), **records}
            results.append(result)
            session.update(tests=session["tests"] + 1, seconds=round(time.monotonic() - start))
            meta.update(seconds=round(time.monotonic() - start), done=len(results), finished=_now(),
                        complete=len(results) == len(tests))
            write_json(json_path, meta, results + unselected)
            if markdown_path:
                write_markdown(markdown_path, meta, results)
            progress(f"[{index}/{len(tests)}] {result['category']:10s} {test_id} "
                     f"({records['stock'].get('seconds', 0):.0f} s + {records['fold'].get('seconds', 0):.0f} s)"
                     + ("  REGRESSION" if result["regression"] else ""))
    meta.update(seconds=round(time.monotonic() - start), done=len(results), finished=_now(),
                complete=len(results) == meta["selected"])
    write_json(json_path, meta, results + unselected)
    if markdown_path:
        write_markdown(markdown_path, meta, results)
    return {"meta": meta, "results": results}
