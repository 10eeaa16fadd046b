"""Export, fold, lower, serialise and run each (model, variant, backend).

The work is split in two phases to fit a small machine:

1. *Build* (parallel, ``jobs`` worker processes): one unit per (model, variant)
   exports the model, applies the variant, lowers the result for every CPU backend
   (portable, XNNPACK), writes the ``.pte``, loads it in the ExecuTorch runtime and
   runs it once to compare with eager PyTorch. The ``qnn`` backend has one unit per
   (model, precision) that lowers every variant for HTP (`benchmarks.qnn_unit`), each
   in a fresh worker process (the QNN libraries stay out of the CPU workers).
2. *Time* (serial, in this process, nothing else running): median latency of up
   to ``runs`` timed ``forward`` calls after a warm-up, within a time budget (CPU
   backends; a QNN ``.pte`` runs on the emulated HTP once, in its build unit).

Every step is guarded: a failure becomes the row's ``status`` (traceback kept)
and the run continues; a crashed worker is retried once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.export import ExportedProgram

from . import _worker, graph_stats, models, variants, verdict
from .quantized import SUFFIX as QUANTIZED_SUFFIX

logger = logging.getLogger(__name__)

BACKENDS = ("portable", "xnnpack", "qnn")
CPU_BACKENDS = ("portable", "xnnpack")

# Rough relative build cost, used only to start the slowest units first.
_MODEL_COST = {"swin_v2_t": 10, "vit_b_16": 6, "t5_encoder": 5, "mobilenet_v3_small": 3,
               "llama": 2, "resnet18": 1, "llama_1b": 20}


@dataclasses.dataclass
class Row:
    """One benchmark result: a (model, variant, backend[, precision]) row.

    Bytes are bytes, ``*_s`` seconds, ``*_ms`` milliseconds. QNN rows (``backend == "qnn"``)
    fill the shared fields where the meaning agrees (``.pte`` bytes, fold and lowering seconds,
    max abs diff against eager, the fold report; ``cold_run_ms`` is the emulated HTP's run) and
    QNN's own fields (partitions, CPU ops, context-binary bytes); CPU rows leave those None.
    """

    model: str
    variant: str
    backend: str
    precision: Optional[str] = None          # fp32 / 8a8w (CPU rows); fp16 / 8a8w / 16a4w (QNN)
    status: str = "ok"                       # ok, mismatch: ..., unverified: ..., error (<stage>): ..., skipped: <why>
    pte_bytes: Optional[int] = None
    const_bytes: Optional[int] = None        # Edge program right before partitioning
    aten_const_bytes: Optional[int] = None   # ATen program handed to lowering
    fold_bytes_before: Optional[int] = None  # from FoldReport (fold_constants only)
    fold_bytes_after: Optional[int] = None
    aten_nodes: Optional[int] = None
    edge_nodes: Optional[int] = None
    const_only_nodes: Optional[int] = None   # Edge program right before partitioning
    aten_const_only_nodes: Optional[int] = None
    export_time_s: Optional[float] = None
    fold_time_s: Optional[float] = None
    lower_time_s: Optional[float] = None
    cold_run_ms: Optional[float] = None      # first forward() in the build worker
    latency_ms: Optional[float] = None
    latency_runs: int = 0                    # 0: latency_ms is the cold run
    latency_min_ms: Optional[float] = None   # fastest and slowest timed call (spread of the repeats)
    latency_max_ms: Optional[float] = None
    load_average: Optional[float] = None     # 1-minute load average when the row was timed
    max_abs_diff: Optional[float] = None
    eager_max_abs: Optional[float] = None    # scale of the eager output
    tolerance: Optional[float] = None        # largest max_abs_diff still ok (benchmarks.verdict)
    tolerance_rule: Optional[str] = None     # QNN: the bound that gave it (verdict.Tolerance.rule)
    vs_off_max_abs_diff: Optional[float] = None  # QNN: max |HTP output - the fold-off row's HTP output|
    fold_report: Optional[Dict[str, Any]] = None
    note: Optional[str] = None               # e.g. the fold had nothing to do
    mismatch_cause: Optional[str] = None     # QNN: the known fault outside this project the HTP output matches (benchmarks.htp_faults)
    # QNN's own columns (`benchmarks.qnn_rows.QnnRow` has their long form)
    partitions: Optional[int] = None         # QNN delegate calls in the lowered program
    refused_partitions: Optional[int] = None  # partitions the HTP rule kept on the CPU (no runtime input)
    static_partitions: Optional[int] = None  # delegated partitions without a runtime input (0 on HTP)
    cpu_ops: Optional[Dict[str, int]] = None  # op name -> count of ops left outside any delegate
    cpu_op_reasons: Optional[Dict[str, str]] = None
    context_binary_bytes: Optional[int] = None  # HTP context binaries inside the .pte
    constant_bytes_in_partitions: Optional[int] = None
    constant_bytes_on_cpu: Optional[int] = None
    quantize_time_s: Optional[float] = None  # QnnQuantizer: export, prepare, calibrate, convert
    peak_rss_bytes: Optional[int] = None     # peak RSS while the row was lowered and run
    backend_version: Optional[str] = None    # the QNN build (QNN rows)
    qnn_error: Optional[str] = None          # first error QNN's libraries printed
    traceback: Optional[str] = None
    pte_path: Optional[str] = dataclasses.field(default=None, repr=False)
    inputs_path: Optional[str] = dataclasses.field(default=None, repr=False)

    @property
    def cpu_op_count(self) -> Optional[int]:
        """Ops left on the CPU (QNN rows), or None."""
        return None if self.cpu_ops is None else sum(self.cpu_ops.values())

    def to_dict(self) -> Dict[str, Any]:
        """Plain-dict form for JSON (without temporary file paths)."""
        d = dataclasses.asdict(self)
        d.pop("pte_path")
        d.pop("inputs_path")
        d["cpu_op_count"] = self.cpu_op_count
        return d


@dataclasses.dataclass(frozen=True)
class Unit:
    """Build-phase work item: one model under one variant lowered for the CPU backends, or
    (``backends == ("qnn",)``) one model in one QNN precision under every variant."""

    model: str
    variants: Tuple[str, ...]
    backends: Tuple[str, ...]
    quick: bool
    work_dir: str
    precision: Optional[str] = None
    source: Optional[Any] = None  # a saved program's `benchmarks.saved_program.ProgramSource`; None: a built-in model

    @property
    def is_qnn(self) -> bool:
        return self.backends == ("qnn",)

    @property
    def rows(self) -> int:
        return len(self.variants) * len(self.backends)


def cpu_precision(model: str) -> str:
    """``8a8w`` for the XNNPACK-quantized ``*_q8`` models, else ``fp32``."""
    return "8a8w" if model.endswith(QUANTIZED_SUFFIX) else "fp32"


def fail(row: Row, stage: str, exc: BaseException, tb: Optional[str] = None) -> None:
    """Record a failure in `row`: ``error (<stage>): <type>: <first line>`` and the traceback."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    row.status = f"error ({stage}): {type(exc).__name__}: {first}"[:300]
    row.traceback = tb or traceback.format_exc()
    logger.warning("%s/%s/%s failed at %s: %s", row.model, row.variant, row.backend, stage, row.status)


_fail = fail


def export_model(spec: models.ModelSpec) -> ExportedProgram:
    """``torch.export.export`` (non-strict) of ``spec.module`` on ``spec.inputs``; a saved
    program's spec already holds its program (`benchmarks.saved_program`)."""
    if spec.program is not None:
        return spec.program
    with torch.no_grad():
        return torch.export.export(spec.module, spec.inputs, strict=False)


def _probing_xnnpack_partitioner(stats: Dict[str, int]):
    """An ``XnnpackPartitioner`` that records graph statistics of the program it partitions."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    partitioner = XnnpackPartitioner()
    inner = partitioner.partition

    def partition(exported_program: ExportedProgram):
        stats.update(graph_stats.summarize(exported_program))
        return inner(exported_program)

    partitioner.partition = partition  # instance attribute shadows the method
    return partitioner


def lower(program: ExportedProgram, backend: str, edge_passes: Sequence[Any] = ()):
    """Lower ``program`` for ``backend`` with ``to_edge_transform_and_lower``.

    ``edge_passes`` become ``transform_passes`` (run on the Edge program before
    partitioning).  Returns ``(ExecutorchProgramManager, stats)`` where ``stats``
    is :func:`graph_stats.summarize` of the Edge program just before partitioning
    (for ``portable``, which has no partitioner, the final Edge program).
    """
    from executorch.exir import to_edge_transform_and_lower

    # Registers the out-variants of quantized_decomposed q/dq ops (quantized programs on CPU).
    import executorch.kernels.quantized  # noqa: F401

    passes = list(edge_passes) or None
    stats: Dict[str, int] = {}
    if backend == "portable":
        edge = to_edge_transform_and_lower(program, transform_passes=passes)
        stats = graph_stats.summarize(edge.exported_program())
    elif backend == "xnnpack":
        edge = to_edge_transform_and_lower(
            program, transform_passes=passes, partitioner=[_probing_xnnpack_partitioner(stats)])
    else:
        raise ValueError(f"unknown CPU backend {backend!r}; choose from {CPU_BACKENDS}")
    return edge.to_executorch(), stats


def _load(path: str, log_path: Optional[str] = None):
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    import executorch.kernels.quantized  # noqa: F401  (quantized q/dq kernels for portable programs)

    with _native_stderr_to(log_path):
        return _load_for_executorch(path)


@contextlib.contextmanager
def _native_stderr_to(log_path: Optional[str]):
    """Temporarily point file descriptor 2 at ``log_path`` (native-library chatter)."""
    if not log_path:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


def _forward(module, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return list(module.forward(tuple(inputs)))


def eager_outputs(value: Any) -> List[torch.Tensor]:
    """The tensors of a model's output in the order a ``.pte`` returns them (pytree leaves; a
    built-in model returns one tensor, a saved program may return several)."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _compared(got: List[torch.Tensor], want: List[torch.Tensor]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The (got, want) pairs judged by difference: the float outputs, or every output when none is
    float. Raises ValueError when the outputs' count or shapes differ."""
    if len(got) != len(want) or any(tuple(g.shape) != tuple(w.shape) for g, w in zip(got, want)):
        raise ValueError(f"output shapes {[tuple(g.shape) for g in got]} != eager {[tuple(w.shape) for w in want]}")
    pairs = list(zip(got, want))
    return [(g, w) for g, w in pairs if w.dtype.is_floating_point] or pairs


def _max_abs_diff(got: List[torch.Tensor], want: List[torch.Tensor]) -> float:
    return max((float((g.float() - w.float()).abs().max()) for g, w in _compared(got, want) if w.numel()), default=0.0)


def output_scale(expected: List[torch.Tensor]) -> float:
    """max |eager output| over the outputs `_max_abs_diff` compares."""
    return max((float(w.float().abs().max()) for _, w in _compared(expected, expected) if w.numel()), default=0.0)


def _integer_mismatch(got: List[torch.Tensor], want: List[torch.Tensor]) -> Optional[float]:
    """Fraction of integer output elements that differ, beside float outputs (None: no such output)."""
    ints = [(g, w) for g, w in zip(got, want) if not w.dtype.is_floating_point]
    if not ints or len(ints) == len(want):
        return None
    return sum(int((g != w).sum()) for g, w in ints) / max(sum(w.numel() for _, w in ints), 1)


def _lower_and_check(row: Row, prepared: variants.Prepared, spec: models.ModelSpec,
                     expected: List[torch.Tensor], work_dir: str) -> None:
    _worker.announce(f"{row.model} · {row.backend} · {row.variant}")
    passes = variants.fresh_edge_passes(prepared)
    try:
        start = time.perf_counter()
        et_program, stats = lower(prepared.program, row.backend, passes)
        buffer = et_program.buffer
        elapsed = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        _fail(row, "lower", exc)
        return
    del et_program
    pass_time = sum(getattr(p, "elapsed_s", 0.0) for p in passes)
    if passes:  # ATen-stage fold time (if any) plus the Edge-stage pass
        row.fold_time_s = (row.fold_time_s or 0.0) + pass_time
    row.lower_time_s = elapsed - pass_time
    row.pte_bytes = len(buffer)
    row.edge_nodes = stats.get("nodes")
    row.const_only_nodes = stats.get("const_only_nodes")
    row.const_bytes = stats.get("const_bytes")
    row.pte_path = os.path.join(work_dir, f"{row.model}__{row.variant}__{row.backend}.pte")
    try:
        with open(row.pte_path, "wb") as f:
            f.write(buffer)
        del buffer
        module = _load(row.pte_path)
        start = time.perf_counter()
        out = _forward(module, spec.inputs)
        row.cold_run_ms = (time.perf_counter() - start) * 1e3
        row.max_abs_diff = _max_abs_diff(out, expected)
        integer_mismatch = _integer_mismatch(out, expected)
    except Exception as exc:  # noqa: BLE001
        _fail(row, "run", exc)
        return
    row.tolerance = verdict.tolerance(row.precision or cpu_precision(row.model), output_scale(expected))
    row.status = judge_cpu_row(row, expected, integer_mismatch)
    if row.status != "ok":
        logger.warning("%s/%s/%s: %s", row.model, row.variant, row.backend, row.status)


def judge_cpu_row(row: Row, expected: List[torch.Tensor], integer_mismatch: Optional[float] = None) -> str:
    """The status of a CPU row whose ``.pte`` ran: its max abs diff against eager over the float
    outputs judged by `benchmarks.verdict` at the row's precision; integer outputs must match
    exactly (`integer_mismatch`: the fraction of their elements that differ, beside float ones)."""
    if not any(w.dtype.is_floating_point for w in expected):
        return "ok" if row.max_abs_diff == 0 else f"mismatch: integer output differs from eager by {row.max_abs_diff:.3g}"
    return verdict.judge(row.precision or cpu_precision(row.model), row.max_abs_diff, output_scale(expected),
                         integer_mismatch)


def build_unit(unit: Unit) -> List[Row]:
    """Build phase for one unit (`Unit`): export, fold, lower, run once. Never raises."""
    if unit.is_qnn:
        from . import qnn_unit

        return qnn_unit.build_unit(unit.model, unit.variants, unit.precision, unit.quick, unit.source)
    (variant,) = unit.variants
    rows = [Row(unit.model, variant, b, precision=cpu_precision(unit.model)) for b in unit.backends]
    try:
        spec = models.build(unit.model, quick=unit.quick, source=unit.source)
        with torch.no_grad():
            expected = eager_outputs(spec.module(*spec.inputs))
        start = time.perf_counter()
        ep = export_model(spec)
        export_time = time.perf_counter() - start
        if unit.source is not None:  # a saved program: judged at its own precision
            from .saved_program import cpu_precision as program_precision

            for row in rows:
                row.precision = program_precision(ep)
        inputs_path = os.path.join(unit.work_dir, f"{unit.model}__{variant}.inputs.pt")
        torch.save(spec.inputs, inputs_path)
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            _fail(row, "export", exc)
        return rows
    try:
        prepared = variants.prepare(variant, ep)
        aten = graph_stats.summarize(prepared.program)
    except Exception as exc:  # noqa: BLE001
        for row in rows:
            _fail(row, "fold", exc)
        return rows
    del ep
    for row in rows:
        row.export_time_s = export_time
        row.inputs_path = inputs_path
        row.eager_max_abs = output_scale(expected)
        row.aten_nodes = aten["nodes"]
        row.aten_const_only_nodes = aten["const_only_nodes"]
        row.aten_const_bytes = aten["const_bytes"]
        row.fold_report = prepared.fold_report
        row.note = spec.row_note or None
        rep = prepared.fold_report or {}
        row.fold_bytes_before = rep.get("constant_bytes_before", rep.get("bytes_before"))
        row.fold_bytes_after = rep.get("constant_bytes_after", rep.get("bytes_after"))
        if variant != "constant_prop_pass":
            row.fold_time_s = prepared.fold_time_s
        _lower_and_check(row, prepared, spec, expected, unit.work_dir)
        logger.info("%s/%s/%s built: %s", row.model, row.variant, row.backend, row.status)
    return rows


def measure_latency(row: Row, runs: int, budget_s: float, log_path: Optional[str] = None) -> None:
    """Time phase for one row: warm-up, then up to ``runs`` timed calls within ``budget_s``.

    The median is ``latency_ms``; the fastest and slowest calls are kept
    (``latency_min_ms``/``latency_max_ms``: the table marks a row noisy when they
    differ by more than ``report.NOISY_SPREAD``), and so is the 1-minute load
    average at the time (``load_average``). When the build worker's cold run
    already exceeded the budget (slow portable kernels), that cold run is
    reported instead and ``latency_runs`` stays 0.
    """
    if row.status != "ok" or not row.pte_path or row.cold_run_ms is None:
        return
    row.load_average = os.getloadavg()[0]
    if runs <= 0 or row.cold_run_ms > budget_s * 1e3:
        row.latency_ms, row.latency_runs = row.cold_run_ms, 0
        return
    try:
        inputs = torch.load(row.inputs_path)
        module = _load(row.pte_path, log_path)
        _forward(module, inputs)  # warm-up
        times: List[float] = []
        deadline = time.perf_counter() + budget_s
        while len(times) < runs and (not times or time.perf_counter() < deadline):
            start = time.perf_counter()
            module.forward(tuple(inputs))
            times.append((time.perf_counter() - start) * 1e3)
        row.latency_ms, row.latency_runs = statistics.median(times), len(times)
        row.latency_min_ms, row.latency_max_ms = min(times), max(times)
    except Exception as exc:  # noqa: BLE001
        _fail(row, "latency", exc)


def _crashed(unit: Unit, exc: BaseException) -> List[Row]:
    precision = unit.precision or cpu_precision(unit.model)
    rows = [Row(unit.model, v, b, precision=precision) for v in unit.variants for b in unit.backends]
    for row in rows:
        _fail(row, "worker", exc, tb="".join(traceback.format_exception(exc)))
    return rows


def _build_all(units: List[Unit], jobs: int, log_path: Optional[str],
               on_done: Callable[[List[Row]], None], on_building: Callable[[str], None]) -> None:
    """Build every unit in `jobs` worker processes (at least one; CPU units in this process when
    `jobs` <= 1 and there is no QNN unit).

    CPU units share reused workers; each QNN unit gets a fresh one (``max_tasks_per_child=1``),
    also at ``jobs`` = 1, so that no QNN library state and no peak RSS carries from one unit to
    the next.
    A crashed worker's unit is retried once, then its rows are ``error (worker)``. What workers
    start (`benchmarks._worker.announce`) reaches ``on_building``."""
    if jobs <= 1 and not any(u.is_qnn for u in units):
        _worker.listen(on_building)
        try:
            for unit in units:
                on_done(build_unit(unit))
        finally:
            _worker.listen(None)
        return
    jobs = max(jobs, 1)
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    pools: Dict[bool, ProcessPoolExecutor] = {}

    def pool_for(qnn: bool) -> ProcessPoolExecutor:
        if qnn not in pools:
            pools[qnn] = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker.init,
                                             initargs=(log_path, messages),
                                             max_tasks_per_child=1 if qnn else None)
        return pools[qnn]

    queue = list(units)
    attempts: Dict[Unit, int] = {}
    running: Dict[Any, Tuple[Unit, ProcessPoolExecutor]] = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                unit = queue.pop(0)
                pool = pool_for(unit.is_qnn)
                running[pool.submit(build_unit, unit)] = (unit, pool)
            done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            _drain(messages, on_building)
            for fut in done:
                unit, pool = running.pop(fut)
                try:
                    on_done(fut.result())
                except BrokenProcessPool as exc:
                    if pools.get(unit.is_qnn) is pool:  # the next submission gets a new pool
                        del pools[unit.is_qnn]
                        pool.shutdown(wait=False, cancel_futures=True)
                    attempts[unit] = attempts.get(unit, 0) + 1
                    if attempts[unit] >= 2:
                        on_done(_crashed(unit, exc))
                    else:
                        logger.warning("worker crashed on %s/%s; retrying", unit.model, unit.variants)
                        queue.insert(0, unit)
                except Exception as exc:  # noqa: BLE001
                    on_done(_crashed(unit, exc))
        _drain(messages, on_building)
    finally:
        for pool in pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        messages.close()


def _drain(messages: Any, on_building: Callable[[str], None]) -> None:
    import queue as queue_module

    while True:
        try:
            text = messages.get_nowait()
        except (queue_module.Empty, OSError, ValueError):
            return
        on_building(text)


def plan_units(model_names: Sequence[str], variant_names: Sequence[str], backends: Sequence[str],
               quick: bool, work_dir: str, sources: Optional[Dict[str, Any]] = None,
               precisions: Optional[Sequence[str]] = None) -> List[Unit]:
    """The build units of a run, slowest first: per model, one unit per variant for its CPU
    backends and one per QNN precision (`benchmarks.qnn_unit.precisions`; `precisions` when
    given) for ``qnn``, each limited to the backends the model is built for
    (`benchmarks.models.backends_of`; a saved program, named in `sources`, for all three)."""
    from . import qnn_unit

    sources = sources or {}
    units: List[Unit] = []
    for m in model_names:
        source = sources.get(m)
        allowed = BACKENDS if source is not None else models.backends_of(m)
        cpu = tuple(b for b in backends if b in CPU_BACKENDS and b in allowed)
        if cpu:
            units += [Unit(m, (v,), cpu, quick, work_dir, source=source) for v in variant_names]
        if "qnn" in backends and "qnn" in allowed:
            units += [Unit(m, tuple(variant_names), ("qnn",), quick, work_dir, precision=p, source=source)
                      for p in qnn_unit.precisions(m, quick, precisions, program=source is not None)]

    def cost(u: Unit) -> float:
        base = _MODEL_COST.get(u.model.removesuffix(QUANTIZED_SUFFIX), 1)
        if u.is_qnn:  # every variant in one unit; quantized precisions calibrate first
            return base * len(u.variants) * (1.0 if u.precision == "fp16" else 1.5)
        return base

    units.sort(key=lambda u: -cost(u))
    return units


def row_order(row: Row) -> Tuple:
    """Table order: model, backend (portable, xnnpack, qnn), precision, variant."""
    return (row.model, BACKENDS.index(row.backend) if row.backend in BACKENDS else 99, row.precision or "")


def run_all(model_names: Sequence[str], variant_names: Sequence[str], backends: Sequence[str],
            runs: int, work_dir: str, quick: bool = False, jobs: int = 2,
            latency_budget_s: float = 3.0, log_path: Optional[str] = None,
            on_step: Callable[[str, Row], None] = lambda phase, row: None,
            on_building: Callable[[str], None] = lambda text: None,
            sources: Optional[Dict[str, Any]] = None, precisions: Optional[Sequence[str]] = None) -> List[Row]:
    """Benchmark every (model, variant, backend[, precision]); returns all rows, failed and
    skipped ones included. `sources` names the models that are saved programs
    (`benchmarks.saved_program.ProgramSource`); `precisions` chooses the QNN precisions
    (`plan_units`).

    ``on_step(phase, row)`` is called once per row after the build phase (``"build"``) and,
    for CPU rows, once after the time phase (``"time"``); ``on_building(text)`` when a worker
    starts a row (`benchmarks._worker.announce`).
    """
    units = plan_units(model_names, variant_names, backends, quick, work_dir, sources, precisions)
    rows: List[Row] = []

    def done(unit_rows: List[Row]) -> None:
        for row in unit_rows:
            rows.append(row)
            on_step("build", row)

    _build_all(units, jobs, log_path, done, on_building)
    model_rank = {m: i for i, m in enumerate(model_names)}
    variant_rank = {v: i for i, v in enumerate(variant_names)}
    rows.sort(key=lambda r: (model_rank.get(r.model, 99),) + row_order(r)[1:] + (variant_rank.get(r.variant, 99),))
    for row in rows:
        if row.backend == "qnn":
            continue
        measure_latency(row, runs, latency_budget_s, log_path)
        on_step("time", row)
    return rows


def total_rows(model_names: Sequence[str], variant_names: Sequence[str], backends: Sequence[str],
               quick: bool, sources: Optional[Dict[str, Any]] = None,
               precisions: Optional[Sequence[str]] = None) -> int:
    """How many rows `run_all` returns for these arguments."""
    return sum(u.rows for u in plan_units(model_names, variant_names, backends, quick, "", sources, precisions))
