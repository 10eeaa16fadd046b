"""The worker process: imports the suite once, then runs one (test, variant) per request.

Protocol (`pool.Worker` is the other end): one JSON object per line on stdin,
``{"test": "Class.test_name", "variant": "stock"|"fold"}``, answered by one JSON line on the
process's original stdout (the record `run_test` returns); ``{"list": {"classes", "match",
"limit"}}`` is answered with ``{"tests": [...]}`` (`suite.list_tests`); ``{"exit": true}`` ends it. Right
after start it answers ``{"ready": true, ...}`` once the suite is imported. Everything the
tests, executorch and QNN print goes to the log file given on the command line (file
descriptors 1 and 2 are redirected there), so the protocol line is never mixed with it.

Each run is made deterministic and identical for both variants: torch, numpy and ``random``
are seeded with 0 before the test runs (the suite builds its inputs and weights with
``torch.randn`` and friends), so stock and fold lower the same module on the same inputs.

Usage: ``python -m tests.qnn.executorch_suite.worker LOG [--product-root DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
import traceback
import unittest
from typing import Dict, List, Optional

from .classify import emulator_limit, first_line, where
from .variants import install

_TRACEBACK_LINES = 16


class RecordingResult(unittest.TestResult):
    """A ``unittest.TestResult`` that keeps one entry per test or subtest outcome, as data."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: List[Dict] = []

    def _record(self, outcome: str, subtest: Optional[str], err=None, text: Optional[str] = None) -> None:
        entry = {"outcome": outcome, "subtest": subtest}
        if err is not None:
            exc = err[1]
            entry.update(
                error_type=type(exc).__name__,
                first_line=first_line(exc),
                where=where(exc),
                limit=emulator_limit(exc),
                traceback="".join(traceback.format_exception(*err)).splitlines()[-_TRACEBACK_LINES:],
            )
        if text is not None:
            entry["first_line"] = text
        self.entries.append(entry)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record("success", None)

    def addError(self, test, err):
        super().addError(test, err)
        self._record("error", None, err)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record("failure", None, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record("skip", None, text=reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record("success", None, text="expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record("failure", None, text="unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        description = subtest._subDescription()
        if err is None:
            self._record("success", description)
        else:
            outcome = "failure" if issubclass(err[0], test.failureException) else "error"
            self._record(outcome, description, err)


def seed_everything(seed: int = 0) -> None:
    """Seed torch, numpy and ``random`` (the suite draws its inputs and weights from them)."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def run_test(suite, test_id: str, variant: str) -> Dict:
    """Run one suite test with `variant`'s lowering; returns its record.

    Returns:
        ``{"test", "variant", "status": "ran", "seconds", "lowerings", "lowered", "entries"}``;
        ``entries`` has one dict per outcome (``outcome``: success/failure/error/skip;
        ``subtest``; for failures ``first_line``, ``error_type``, ``where``, ``limit`` (why the
        emulator cannot run it, or None) and the ``traceback`` tail).
    """
    cls_name, method = test_id.split(".", 1)
    counter = install(suite, variant)
    seed_everything(0)
    result = RecordingResult()
    start = time.monotonic()
    unittest.TestSuite([getattr(suite, cls_name)(method)]).run(result)
    seconds = time.monotonic() - start
    gc.collect()
    return {"test": test_id, "variant": variant, "status": "ran", "seconds": round(seconds, 2),
            "lowerings": counter.calls, "lowered": counter.returned, "entries": result.entries}


def serve(log_path: str, product_root: Optional[str]) -> None:
    """The request loop (see the module docstring)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    from .suite import list_tests, load_suite

    suite = load_suite(product_root)
    import qnn

    protocol.write(json.dumps({"ready": True, "pid": os.getpid(), "qnn_build_id": qnn.load_qnn_sdk().build_id}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("exit"):
            break
        if "list" in request:
            protocol.write(json.dumps({"tests": list_tests(suite, **request["list"])}) + "\n")
            continue
        print(f"===== {request['test']} [{request['variant']}]", flush=True)
        try:
            record = run_test(suite, request["test"], request["variant"])
        except Exception as exc:  # the harness itself failed (an unknown test id, ...)
            record = {"test": request["test"], "variant": request["variant"], "status": "crashed",
                      "first_line": f"harness: {first_line(exc)}", "entries": []}
        sys.stdout.flush()
        sys.stderr.flush()
        protocol.write(json.dumps(record) + "\n")


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--product-root", default=None)
    args = parser.parse_args(argv)
    serve(args.log, args.product_root)


if __name__ == "__main__":
    main()
