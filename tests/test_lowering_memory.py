"""`benchmarks.lowering_memory`'s phase recorder: a phase's peak is credited to it (not to the
phase around it), and its table renders. No QNN, no model: the QNN measurement itself is the
documented llama_1b run (docs/benchmarks.md, "Memory of the llama_1b QNN lowering")."""

from __future__ import annotations

import mmap
import os
import types

import pytest

from benchmarks import lowering_memory as lm

pytestmark = pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="Linux /proc/self/clear_refs")

MB = 1 << 20


def _touch(nbytes: int) -> mmap.mmap:
    """`nbytes` of new resident memory: an anonymous mapping, written page by page. Not a
    bytearray: malloc may serve that from pages already resident (memory an earlier test in the
    same worker freed), and the RSS would not grow at all."""
    buf = mmap.mmap(-1, nbytes)
    for i in range(0, nbytes, mmap.PAGESIZE):
        buf[i] = 1
    return buf


def test_a_phase_peak_is_credited_to_the_innermost_phase_and_freed_memory_is_not_a_later_peak():
    rec = lm.PhaseRecorder(interval=0.001).start()
    owner = types.SimpleNamespace(allocate=lambda: len(_touch(64 * MB)))
    rec.wrap(owner, "allocate", "allocate")
    with rec.phase("outer"):
        assert owner.allocate() == 64 * MB  # the wrapper returns the function's result
        with rec.phase("after"):
            pass
    rec.stop()
    grew = rec.inclusive["allocate"] - rec.entry_rss["allocate"]
    assert grew >= 60 * MB
    assert rec.inclusive["outer"] >= rec.inclusive["allocate"]  # nested phases count for the outer one
    assert rec.exclusive.get("outer", 0) < rec.inclusive["allocate"] - 30 * MB
    assert rec.exclusive["after"] < rec.inclusive["allocate"] - 30 * MB
    assert rec.peak_phase() == "allocate"
    assert rec.seconds["allocate"] > 0 and rec.samples


def test_the_table_has_one_line_per_row():
    row = {"mode": "on", "run": 1, "position_in_process": 1, "pid": 1, "process_peak_before_row": 2e9,
           "rss_before_row": 1e9, "lowering_peak": 3e9, "row_peak": 3.5e9, "fold_hwm_above_entry": 12e6,
           "stored_bytes": 48992, "peak_phase": "QNN preprocess (HTP compile)",
           "lowering_peak_phase": "QNN preprocess (HTP compile)",
           "phases": {"fold_constants": {"peak_exclusive": 2.5e9}}}
    lines = lm.table([row, {**row, "mode": "off", "run": 2, "fold_hwm_above_entry": None, "stored_bytes": None}])
    assert len(lines) == 4 and "| on | 1 (1) | 2.00 GB | 1.00 GB | 3.00 GB | 3.50 GB | 2.50 GB | +12.0 MB | 48,992 |" in lines[2]
    assert lines[3].startswith("| off | 2 (1) |") and "| — | — |" in lines[3]
    assert lm.phase_table([row])[2] == "| fold_constants | 2.50 |"
