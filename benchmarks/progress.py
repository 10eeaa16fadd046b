"""Progress lines of a benchmark run on stderr: the row being built, rows done / total, the time
phase. Plain lines (no terminal control), so a log file reads the same as a terminal."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO


def row_label(row: Any) -> str:
    """``model · backend [precision] · variant`` of a `benchmarks.runner.Row`."""
    backend = f"{row.backend} {row.precision}" if row.backend == "qnn" and row.precision else row.backend
    return f"{row.model} · {backend} · {row.variant}"


class Progress:
    """Counts built rows out of `total` and prints one line per event, with the elapsed time."""

    def __init__(self, total: int, stream: Optional[TextIO] = None) -> None:
        self.total = total
        self.built = 0
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()

    def _line(self, text: str) -> None:
        elapsed = time.perf_counter() - self.start
        print(f"[{self.built:>3}/{self.total} rows built, {elapsed / 60:4.1f} min] {text}", file=self.stream, flush=True)

    def building(self, what: str) -> None:
        """A worker started `what` (`benchmarks._worker.announce`)."""
        self._line(f"building {what}")

    def step(self, phase: str, row: Any) -> None:
        """`benchmarks.runner.run_all`'s ``on_step``: a row built (``"build"``) or timed (``"time"``)."""
        if phase == "build":
            self.built += 1
            extra = f", {row.pte_bytes:,} bytes" if row.pte_bytes else ""
            self._line(f"built {row_label(row)}: {_short(row.status)}{extra}")
        elif row.latency_ms is not None:
            self._line(f"timed {row_label(row)}: {row.latency_ms:.1f} ms")


def _short(status: str, limit: int = 100) -> str:
    text = str(status).replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"
