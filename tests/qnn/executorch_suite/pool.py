"""The supervising side of the worker process: one worker at a time, a timeout per run, and a
fresh worker after a hang, a crash or every `recycle` tests.

A hang or a crash (a segfault in QNN, an abort in executorch) costs only the run it happened
in: the worker is killed (by its own pid) or found dead, the run is recorded as ``timeout`` or
``crashed`` with the tail of the worker's log, and the next run starts a new worker.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Dict, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
IMPORT_TIMEOUT = 600.0


class WorkerStartError(RuntimeError):
    """The worker could not import the suite."""


def _log_tail(path: str, lines: int = 6) -> list:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            return f.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []


class Worker:
    """A ``python -m tests.qnn.executorch_suite.worker`` process and its request pipe.

    Args:
        log_path: where the worker's own output goes (appended).
        product_root: the checkout whose ``folding``/``qnn`` the worker imports (None: as installed).
        recycle: start a fresh worker after this many tests (bounds the memory a long run grows).
    """

    def __init__(self, log_path: str, product_root: Optional[str] = None, recycle: int = 25) -> None:
        self.log_path = log_path
        self.product_root = product_root
        self.recycle = recycle
        self.proc: Optional[subprocess.Popen] = None
        self.tests_served = 0
        self.info: Dict = {}
        self._buffer = b""

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "tests.qnn.executorch_suite.worker", self.log_path]
        if self.product_root:
            cmd += ["--product-root", self.product_root]
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None)
        self._buffer = b""
        self.tests_served = 0
        ready = self._read_line(IMPORT_TIMEOUT)
        if ready is None or not ready.get("ready"):
            self.stop()
            raise WorkerStartError(f"worker did not start; log tail: {_log_tail(self.log_path)}")
        self.info = ready

    def _read_line(self, timeout: float) -> Optional[Dict]:
        """The next protocol line as a dict; None on timeout or when the worker exits."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, test_id: str, variant: str, timeout: float) -> Dict:
        """Run one (test, variant); a timeout or a dead worker becomes the record's status."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write((json.dumps({"test": test_id, "variant": variant}) + "\n").encode())
        self.proc.stdin.flush()
        start = time.monotonic()
        record = self._read_line(timeout)
        if record is not None:
            return record
        seconds = round(time.monotonic() - start, 2)
        if self.proc.poll() is None:
            self.stop(kill=True)
            return {"test": test_id, "variant": variant, "status": "timeout", "seconds": seconds,
                    "first_line": f"timeout after {timeout:.0f} s", "entries": [], "log_tail": _log_tail(self.log_path)}
        code = self.proc.returncode
        self.proc = None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return {"test": test_id, "variant": variant, "status": "crashed", "seconds": seconds,
                "first_line": f"worker crashed ({how})", "entries": [], "log_tail": _log_tail(self.log_path)}

    def list_tests(self, classes, match: Optional[str] = None, limit: Optional[int] = None) -> list:
        """The suite's test ids, in the runner's order (`suite.list_tests`, in the worker)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        request = {"list": {"classes": list(classes), "match": match, "limit": limit}}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read_line(IMPORT_TIMEOUT)
        if reply is None:
            raise WorkerStartError(f"worker did not list the tests; log tail: {_log_tail(self.log_path)}")
        return reply["tests"]

    def finished_test(self) -> None:
        """Count one test (both variants); recycle the worker when it has served enough."""
        self.tests_served += 1
        if self.recycle and self.tests_served >= self.recycle:
            self.stop()

    def stop(self, kill: bool = False) -> None:
        """End the worker: ask it to exit, then kill it (by its pid) if it does not (at once
        when `kill`: it is busy with a run that timed out)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
            proc.wait()
            return
        try:
            proc.stdin.write(b'{"exit": true}\n')
            proc.stdin.flush()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
