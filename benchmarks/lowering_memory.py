"""Memory of one QNN row's lowering, fold off and on, each in a fresh process, phase by phase.

    python -m benchmarks.lowering_memory --model llama_1b --precision 16a4w
        [--variants off,on,on,off] [--no-run] [--same-process] [--census] [--out results/lowering_memory]

Each entry of ``--variants`` (``off``, ``on``; the `benchmarks.qnn_rows` modes) runs in its own
spawned process, one after another, never two at once. The process builds the model and
quantizes it with the benchmark's own code (`benchmarks.models.build`,
`benchmarks.qnn_rows.quantize_for_htp`), computes the eager reference, and makes the QNN row
with the row's own function (`benchmarks.qnn_rows._lower_one`: `qnn.to_edge_transform_and_lower_to_qnn`,
`qnn.describe_partitions`, ``to_executorch().buffer`` and, unless ``--no-run``, the run on the
emulated HTP), as ``python -m benchmarks --backends qnn`` does for that row. ``--same-process``
makes all the variants in one process instead, in order, as the benchmark's worker does (its
rows of one model and precision share a process: fold off first, then fold on).

What is measured (Linux, bytes):

- the process's peak RSS before the row (model built, quantized, eager reference computed) and
  after it: the highest mark of all the intervals below, which is what ``ru_maxrss`` would say
  (the kernel's ``ru_maxrss`` of a live process reads the same mark, so the resets below make it
  useless here);
- per phase, the resident-set high-water mark while that phase was the innermost one running:
  at every phase entry and exit the kernel's mark (``VmHWM``) is read and reset
  (``/proc/self/clear_refs`` 5), so each interval's peak is exact, whatever the GIL lets a
  sampler see. Phases are labelled by wrapping, in this process only, functions of qnn,
  executorch and the benchmark (`PHASES`); the library is not changed;
- the fold's own high-water mark above the RSS at its entry (``fold_constants`` in the
  partitioner's pre-decomposition hook), and what it stores (``FoldReport``: constant bytes
  after minus before, and the lifted constants' bytes);
- a timeline: (seconds, RSS, innermost phase) sampled every ``--interval`` seconds by a thread;
- with ``--census``, live tensor storage bytes (tensors reachable from the garbage collector,
  each storage once) before the row, after the lowering and after the row, and the RSS the row
  starts from as found, after ``gc.collect()`` and after glibc's ``malloc_trim(0)`` (the row
  then starts from the trimmed heap, which the benchmark's rows do not), and the RSS by kind of
  mapping (``/proc/self/smaps``) at the row's start and end.

Prints a Markdown table and writes ``lowering_memory.json`` (timelines included) and
``lowering_memory.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .peak_memory import hwm_bytes, reset_hwm, rss_bytes

MODES = ("off", "on")


class PhaseRecorder:
    """Labelled phases, nested; exact per-phase peaks from ``VmHWM`` reset at each boundary, and
    a sampling thread's timeline.

    Attributes:
        exclusive: label -> highest ``VmHWM`` over the intervals where it was the innermost phase.
        inclusive: label -> highest ``VmHWM`` while it was running (nested phases included).
        entry_rss: label -> RSS at its first entry.
        exit_rss: label -> RSS at its last exit.
        seconds: label -> wall seconds, nested phases included (summed over entries).
        samples: (seconds since start, RSS, innermost label).
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.stack: List[str] = ["(outside phases)"]
        self.exclusive: Dict[str, int] = {}
        self.inclusive: Dict[str, int] = {}
        self.entry_rss: Dict[str, int] = {}
        self.exit_rss: Dict[str, int] = {}
        self.seconds: Dict[str, float] = {}
        self.samples: List[tuple] = []
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        reset_hwm()

    def start(self) -> "PhaseRecorder":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._boundary()
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.samples.append((round(time.perf_counter() - self._start, 4), rss_bytes(), self.stack[-1]))

    def _boundary(self) -> None:
        """Close the interval that ends now: credit its peak to the phases running, reset the mark."""
        hwm = hwm_bytes()
        inner = self.stack[-1]
        self.exclusive[inner] = max(self.exclusive.get(inner, 0), hwm)
        for label in set(self.stack):
            self.inclusive[label] = max(self.inclusive.get(label, 0), hwm)
        reset_hwm()

    @contextlib.contextmanager
    def phase(self, label: str):
        if label in self.stack:  # a re-entrant call (a wrapped function calling itself): one phase
            yield
            return
        with self._lock:
            self._boundary()
            self.stack.append(label)
            self.entry_rss.setdefault(label, rss_bytes())
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._boundary()
                self.stack.pop()
                self.exit_rss[label] = rss_bytes()
            self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

    def wrap(self, owner: Any, name: str, label: str, kind: str = "function") -> None:
        """Replace ``owner.name`` by a wrapper that runs it inside `phase(label)`. `kind`:
        ``function`` (module attribute or plain method), ``staticmethod``, ``property``."""
        recorder = self
        if kind == "property":
            prop = owner.__dict__[name]

            def getter(obj):
                with recorder.phase(label):
                    return prop.fget(obj)

            setattr(owner, name, property(getter))
            return
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            with recorder.phase(label):
                return original(*args, **kwargs)

        setattr(owner, name, staticmethod(wrapper) if kind == "staticmethod" else wrapper)

    def peak_phase(self, labels: Optional[List[str]] = None) -> Optional[str]:
        """The phase whose exclusive peak is highest (among `labels` when given)."""
        items = [(v, k) for k, v in self.exclusive.items() if labels is None or k in labels]
        return max(items)[1] if items else None


# Labels, outermost first. `_instrument` wraps the functions that run them.
ROW = "row"
LOWERING = "lowering (to_edge_transform_and_lower_to_qnn)"
PHASES = (
    ("build model", "benchmarks.models.build"),
    ("quantize", "benchmarks.qnn_rows.quantize_for_htp: export, prepare_pt2e, calibration, convert_pt2e"),
    ("eager reference", "the quantized module on the example input (the row's expected output)"),
    (ROW, "benchmarks.qnn_rows._lower_one: lowering, description, serialisation, HTP run"),
    (LOWERING, "qnn.to_edge_transform_and_lower_to_qnn (the rest: argument handling)"),
    ("export (torch.export strict)", "torch.export.export in qnn.lowering._export_for_qnn"),
    ("QNN export passes", "transform_for_export_pipeline"),
    ("to_edge_transform_and_lower (rest)", "executorch's function outside the phases below (sanity checks)"),
    ("to_edge: decompositions + edge program", "_gen_edge_manager_for_partitioners, fold hook excepted"),
    ("fold stage hook", "QnnPartitioner.transform_for_pre_decomposition outside fold_constants"),
    ("fold_constants", "folding.fold_constants (inplace) in the hook"),
    ("QNN to-edge passes", "EdgeProgramManager.transform"),
    ("to_backend (rest)", "EdgeProgramManager.to_backend outside partition and preprocess"),
    ("partition", "QnnPartitioner.partition"),
    ("copy for preprocess", "BackendDetails.copy_exported_program_for_preprocess (deepcopy of the partition)"),
    ("QNN preprocess (HTP compile)", "QnnBackend.preprocess(_multimethod) outside the two phases below "
     "(the context binary's copy to bytes among it)"),
    ("QNN op wrappers (Python)", "QnnBackend._build_op_wrappers: QNN tensors and ops from the partition's nodes"),
    ("QNN Compile (C++)", "the QNN manager's Compile: graph finalize and HTP context binary (QNN's libraries)"),
    ("row bookkeeping", "describe_partitions, cpu-op reasons, context-binary bytes"),
    ("to_executorch", "EdgeProgramManager.to_executorch (passes, memory planning, emit)"),
    ("serialise .pte buffer", "ExecutorchProgramManager.buffer"),
    ("HTP run", "qnn.run_pte: load the .pte in the runtime, run on the emulated HTP"),
)


def _instrument(rec: PhaseRecorder) -> None:
    """Label the lowering's phases by wrapping the functions that run them (this process only)."""
    import torch
    from executorch.backends.qualcomm import qnn_preprocess
    from executorch.backends.qualcomm.qnn_preprocess import QnnBackend
    from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType
    from executorch.exir.program import _program
    from executorch.exir.program._program import EdgeProgramManager, ExecutorchProgramManager

    import qnn
    import qnn.lowering
    import qnn.partitioner
    from qnn.pass_manager import pass_manager_cls

    from . import qnn_rows

    rec.wrap(qnn_rows, "_lower_one", ROW)
    rec.wrap(qnn_rows, "_lower", LOWERING)
    rec.wrap(torch.export, "export", "export (torch.export strict)")
    rec.wrap(pass_manager_cls(QnnExecuTorchBackendType.kHtpBackend), "transform_for_export_pipeline", "QNN export passes")
    rec.wrap(qnn.lowering, "to_edge_transform_and_lower", "to_edge_transform_and_lower (rest)")
    rec.wrap(_program, "_gen_edge_manager_for_partitioners", "to_edge: decompositions + edge program")
    rec.wrap(qnn.partitioner.QnnPartitioner, "transform_for_pre_decomposition", "fold stage hook")
    rec.wrap(qnn.partitioner, "fold_constants", "fold_constants")
    rec.wrap(EdgeProgramManager, "transform", "QNN to-edge passes")
    rec.wrap(EdgeProgramManager, "to_backend", "to_backend (rest)")
    rec.wrap(qnn.partitioner.QnnPartitioner, "partition", "partition")
    rec.wrap(QnnBackend, "copy_exported_program_for_preprocess", "copy for preprocess", kind="staticmethod")
    rec.wrap(QnnBackend, "preprocess", "QNN preprocess (HTP compile)", kind="staticmethod")
    rec.wrap(QnnBackend, "preprocess_multimethod", "QNN preprocess (HTP compile)", kind="staticmethod")
    rec.wrap(QnnBackend, "_build_op_wrappers", "QNN op wrappers (Python)", kind="staticmethod")
    get_manager = qnn_preprocess.get_current_qnn_manager

    class _Manager:
        """The QNN manager, its ``Compile`` labelled (a pybind object: its methods cannot be replaced)."""

        def __init__(self, manager):
            self._manager = manager

        def __getattr__(self, name):
            return getattr(self._manager, name)

        def Compile(self, *args, **kwargs):  # noqa: N802 - QNN's name
            with rec.phase("QNN Compile (C++)"):
                return self._manager.Compile(*args, **kwargs)

    qnn_preprocess.get_current_qnn_manager = lambda *a, **k: _Manager(get_manager(*a, **k))
    rec.wrap(qnn, "describe_partitions", "row bookkeeping")
    rec.wrap(EdgeProgramManager, "to_executorch", "to_executorch")
    rec.wrap(ExecutorchProgramManager, "buffer", "serialise .pte buffer", kind="property")
    rec.wrap(qnn, "run_pte", "HTP run")


def live_tensor_bytes() -> int:
    """Bytes of the tensor storages reachable from Python objects the garbage collector tracks
    (each storage once; views and shared tensors count once)."""
    import torch

    gc.collect()
    seen: Dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and not obj.is_meta and obj.layout == torch.strided:
                storage = obj.untyped_storage()
                if storage.device.type == "cpu" and storage.data_ptr():
                    seen[storage.data_ptr()] = storage.nbytes()
        except Exception:  # noqa: BLE001 - fake, functional or otherwise storage-less tensors
            continue
    return sum(seen.values())


def rss_by_mapping() -> Dict[str, Any]:
    """RSS by kind of mapping (``/proc/self/smaps``): ``heap`` (the main malloc arena),
    ``anonymous`` (mmap'd memory: other arenas, large allocations, allocators of native
    libraries), ``files`` (mapped files: libraries' code and data) and the five largest files."""
    kinds: Dict[str, int] = {"heap": 0, "anonymous": 0, "files": 0, "other": 0}
    files: Dict[str, int] = {}
    kind, path = "other", ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                path = head[5].strip() if len(head) > 5 else ""
                kind = "heap" if path == "[heap]" else "anonymous" if not path else "files" if path.startswith("/") else "other"
            elif head[0] == "Rss:":
                kb = int(head[1]) * 1024
                kinds[kind] += kb
                if kind == "files":
                    files[path] = files.get(path, 0) + kb
    kinds["largest_files"] = dict(sorted(files.items(), key=lambda kv: -kv[1])[:5])
    return kinds


def malloc_trim() -> Optional[int]:
    """Give the heap's free memory back to the system (glibc ``malloc_trim(0)``); the RSS after
    it, or None without glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return rss_bytes()


def _measure(model: str, precision: str, modes: List[str], run: bool, interval: float, census: bool,
             log_path: Optional[str], queue) -> None:
    """One process: build, quantize, then one row per mode (in order), measured."""
    from . import _worker

    _worker.init(log_path)  # the benchmark worker's setup: stderr to the log, one torch thread
    try:
        queue.put(_measure_rows(model, precision, modes, run, interval, census))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        queue.put({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def _measure_rows(model: str, precision: str, modes: List[str], run: bool, interval: float,
                  census: bool = False) -> List[dict]:
    import torch

    from . import models, qnn_rows

    rec = PhaseRecorder(interval).start()
    with contextlib.redirect_stdout(sys.stderr):
        with rec.phase("build model"):
            spec = models.build(model)
        with rec.phase("quantize"):
            if precision == "fp16":
                with torch.no_grad():
                    module = torch.export.export(spec.module, spec.inputs, strict=False).module()
            else:
                module = qnn_rows.quantize_for_htp(spec.module, spec.inputs, precision)
        with rec.phase("eager reference"), torch.no_grad():
            expected = qnn_rows._tensors(module(*spec.inputs))
        _instrument(rec)
        results = []
        for mode in modes:
            results.append(_measure_row(rec, model, precision, mode, module, spec.inputs, expected, run, census))
    rec.stop()
    for r in results:
        r["timeline"] = rec.samples if r is results[-1] else None
    return results


def _measure_row(rec: PhaseRecorder, model: str, precision: str, mode: str, module, inputs, expected,
                 run: bool, census: bool = False) -> dict:
    import torch

    from . import qnn_rows

    captured: Dict[str, Any] = {}
    original_lower = qnn_rows._lower  # the wrapped one: keep the manager's partitioner for the report

    def lower(row, *args, **kwargs):
        manager, partitioner = original_lower(row, *args, **kwargs)
        captured["fold_reports"] = list(partitioner.fold_reports)
        if census:
            with rec.phase("census"):
                captured["live_tensor_bytes_after_lowering"] = live_tensor_bytes()
        return manager, partitioner

    untouched = rss_bytes()
    before_census = after_gc = after_trim = mappings_before = mappings_after = None
    if census:  # what of the RSS the row starts from is live tensors, garbage, or free heap kept by malloc
        with rec.phase("census"):
            mappings_before = rss_by_mapping()
            before_census = live_tensor_bytes()  # runs gc.collect()
            after_gc = rss_bytes()
            after_trim = malloc_trim()
    with rec._lock:
        rec._boundary()
        # the process's peak so far (its ru_maxrss, had nothing reset it), the census's own excepted
        peak_before = max(v for k, v in rec.exclusive.items() if k != "census")
        for d in (rec.exclusive, rec.inclusive, rec.entry_rss, rec.exit_rss, rec.seconds):
            d.clear()
    rss_before = rss_bytes()
    start = time.perf_counter()
    row = qnn_rows.QnnRow(model, precision, mode)
    qnn_rows._lower = lower
    try:
        with torch.no_grad():
            outputs = qnn_rows._lower_one(row, module, inputs, expected, None, run, start, None)
    finally:
        qnn_rows._lower = original_lower
    wall = time.perf_counter() - start
    with rec._lock:
        rec._boundary()
    peak_after = max(peak_before, max(rec.exclusive.values()))
    del outputs
    after_census = None
    if census:
        with rec.phase("census"):
            after_census = live_tensor_bytes()
            mappings_after = rss_by_mapping()
    reports = captured.get("fold_reports") or []
    stored = sum(r.constant_bytes_after - r.constant_bytes_before for r in reports)
    lifted = sum(c.nbytes for r in reports for c in r.lifted if not c.reused) if reports else 0
    phases = [label for label, _ in PHASES if label in rec.inclusive and label != "census"]
    row_peak = rec.inclusive.get(ROW)
    lowering_peak = rec.inclusive.get(LOWERING)
    fold_peak = rec.inclusive.get("fold_constants")
    fold_entry = rec.entry_rss.get("fold_constants")
    return {
        "model": model, "precision": precision, "mode": mode, "pid": os.getpid(),
        "status": row.status, "pte_bytes": row.pte_bytes, "partitions": row.partitions,
        "wall_s": wall,
        "rss_before_row": rss_before,
        "process_peak_before_row": peak_before, "process_peak_after_row": peak_after,
        "row_peak": row_peak, "lowering_peak": lowering_peak,
        "peak_phase": rec.peak_phase(phases), "lowering_peak_phase": rec.peak_phase(
            [p for p in phases if p not in ("row bookkeeping", "to_executorch", "serialise .pte buffer", "HTP run", ROW)]),
        "fold_entry_rss": fold_entry, "fold_peak": fold_peak,
        "fold_hwm_above_entry": None if fold_peak is None else fold_peak - fold_entry,
        "fold_seconds": rec.seconds.get("fold_constants"),
        "stored_bytes": stored if reports else None, "lifted_bytes": lifted if reports else None,
        "folded_nodes": sum(len(r.folded) for r in reports) if reports else None,
        "rss_at_row_start_untouched": untouched, "rss_after_gc_collect": after_gc, "rss_after_malloc_trim": after_trim,
        "rss_by_mapping_at_row_start": mappings_before, "rss_by_mapping_after_row": mappings_after,
        "live_tensor_bytes_before_row": before_census,
        "live_tensor_bytes_after_lowering": captured.get("live_tensor_bytes_after_lowering"),
        "live_tensor_bytes_after_row": after_census,
        "phases": {label: {"peak_exclusive": rec.exclusive.get(label), "peak_inclusive": rec.inclusive.get(label),
                           "entry_rss": rec.entry_rss.get(label), "exit_rss": rec.exit_rss.get(label),
                           "seconds": rec.seconds.get(label)} for label in phases},
    }


def run_variants(model: str, precision: str, variants: List[str], run: bool = True, interval: float = 0.005,
                 same_process: bool = False, census: bool = False, log_path: Optional[str] = None,
                 on_result: Callable[[dict], None] = lambda r: None) -> List[dict]:
    """One spawned process per entry of `variants` (or one for all with `same_process`), one at a
    time. Returns one result dict per row (``run``: 1-based index of the process)."""
    ctx = mp.get_context("spawn")
    groups = [variants] if same_process else [[v] for v in variants]
    results = []
    for index, modes in enumerate(groups, 1):
        queue = ctx.Queue()
        proc = ctx.Process(target=_measure, args=(model, precision, modes, run, interval, census, log_path, queue))
        proc.start()
        got = queue.get()
        proc.join()
        if isinstance(got, dict):  # an error
            raise RuntimeError(f"{model} {precision} {modes}: {got['error']}\n{got['traceback']}")
        for position, r in enumerate(got, 1):
            r["run"], r["position_in_process"] = index, position
            results.append(r)
            on_result(r)
    return results


def _gb(b: Optional[int]) -> str:
    return "—" if b is None else f"{b / 1e9:.2f} GB"


def _mb(b: Optional[int]) -> str:
    return "—" if b is None else f"{b / 1e6:+.1f} MB"


def table(results: List[dict]) -> List[str]:
    """The Markdown table: one line per row measured."""
    lines = [
        "| variant | run (pid) | process peak RSS before the row | RSS at row start | peak RSS of the lowering | "
        "peak RSS of the row (+ serialisation, HTP run) | row peak above row start | "
        "fold's own high-water mark above its entry RSS | stored bytes | phase of the row's peak | "
        "phase of the lowering's peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        stored = "—" if r["stored_bytes"] is None else f"{r['stored_bytes']:,}"
        where = f"{r['run']}" + (f".{r['position_in_process']}" if r.get("position_in_process", 1) > 1 else "")
        lines.append(
            f"| {r['mode']} | {where} ({r['pid']}) | {_gb(r['process_peak_before_row'])} | {_gb(r['rss_before_row'])} | "
            f"{_gb(r['lowering_peak'])} | {_gb(r['row_peak'])} | {_gb(r['row_peak'] - r['rss_before_row'])} | "
            f"{_mb(r['fold_hwm_above_entry'])} | {stored} | {r['peak_phase']} | {r['lowering_peak_phase']} |")
    return lines


def phase_table(results: List[dict]) -> List[str]:
    """Per phase, the exclusive peak (GB) of each row measured."""
    labels = [label for label, _ in PHASES if any(label in r["phases"] for r in results)]
    head = [f"{r['mode']} {r['run']}" + (f".{r['position_in_process']}" if r.get("position_in_process", 1) > 1 else "")
            for r in results]
    lines = ["| phase (innermost) | " + " | ".join(head) + " |", "|---|" + "---|" * len(results)]
    for label in labels:
        cells = []
        for r in results:
            p = r["phases"].get(label)
            cells.append("—" if p is None or p["peak_exclusive"] is None else f"{p['peak_exclusive'] / 1e9:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lowering_memory", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama_1b")
    p.add_argument("--precision", default="16a4w", choices=("fp16", "8a8w", "16a4w"))
    p.add_argument("--variants", default="off,on,on,off", help="comma-separated off/on, one process each, in order")
    p.add_argument("--no-run", action="store_true", help="do not run the .pte on the emulated HTP")
    p.add_argument("--same-process", action="store_true",
                   help="all variants in one process, in order (as the benchmark's worker makes a unit's rows)")
    p.add_argument("--census", action="store_true",
                   help="also count live tensor bytes before the row, after the lowering and after the row, and "
                        "trim the heap before each row (gc.collect(), malloc_trim(0): the benchmark does neither)")
    p.add_argument("--interval", type=float, default=0.005, help="RSS sampling period, seconds")
    p.add_argument("--log", default=None, help="the processes' stderr (QNN's output) goes here (default: stderr)")
    p.add_argument("--out", type=Path, default=Path("results/lowering_memory"))
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in MODES]
    if bad:
        raise SystemExit(f"unknown variants {bad} (choose from {', '.join(MODES)})")
    args.out.mkdir(parents=True, exist_ok=True)

    def show(r: dict) -> None:
        print(f"{r['mode']} run {r['run']}: lowering peak {_gb(r['lowering_peak'])}, row peak {_gb(r['row_peak'])} "
              f"({r['peak_phase']}), fold {_mb(r['fold_hwm_above_entry'])}, stored {r['stored_bytes']}",
              file=sys.stderr, flush=True)

    results = run_variants(args.model, args.precision, variants, run=not args.no_run, interval=args.interval,
                           same_process=args.same_process, census=args.census, log_path=args.log,
                           on_result=show)
    (args.out / "lowering_memory.json").write_text(json.dumps(results, indent=1))
    text = "\n".join(table(results) + [""] + phase_table(results))
    (args.out / "lowering_memory.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
