"""The ``qnn`` backend of the benchmark: one build unit per (model, precision), lowered for
Qualcomm HTP (SM8650) on the real backend in each variant, as `benchmarks.runner.Row`s with
``backend="qnn"``.

Variants map to `benchmarks.qnn_rows` modes: ``none`` -> fold off, ``constant_prop_pass`` ->
executorch's pass at the fold stage's position, ``fold_constants`` -> the ``fold_constants``
compile spec (default `FoldPolicy`). Precisions: ``fp16``, and the float model quantized by
executorch's ``QnnQuantizer`` (``8a8w``, ``16a4w``; `precisions`). Without usable QNN libraries
(no ``qnn`` extra) every row of the unit says ``skipped: <why>`` and the run goes on.

A unit runs in a fresh worker process (`benchmarks.runner`), so its peak RSS is its own.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _worker, models
from .runner import Row, fail

VARIANT_MODES = {"none": "off", "constant_prop_pass": "constant_prop_pass", "fold_constants": "on"}
"""The variants QNN rows are built for, and the `benchmarks.qnn_rows` mode of each."""

PRECISIONS: Tuple[str, ...] = ("fp16", "8a8w")
EXTRA_PRECISIONS: Dict[str, Tuple[str, ...]] = {"llama": ("16a4w",)}
ONLY_PRECISIONS: Dict[str, Tuple[str, ...]] = {"llama_1b": ("16a4w",)}
# --quick: one precision per model, the one where the fold changes the most (t5's 8a8w relative-
# position buckets; llama's mask and rotary code in fp16), to keep the newcomer's run short.
QUICK_PRECISIONS: Dict[str, Tuple[str, ...]] = {"t5_encoder": ("8a8w",)}
QUICK_DEFAULT_PRECISIONS: Tuple[str, ...] = ("fp16",)
PROGRAM_PRECISIONS: Tuple[str, ...] = ("fp16",)
"""A saved program's (``--program``) QNN precisions unless ``--precisions`` chooses."""
ALL_PRECISIONS: Tuple[str, ...] = ("fp16", "8a8w", "16a4w")


def precisions(model: str, quick: bool = False, chosen: Optional[Sequence[str]] = None,
               program: bool = False) -> Tuple[str, ...]:
    """The precisions `model` is built in for QNN: `chosen` (``--precisions``) when given, else
    `PROGRAM_PRECISIONS` for a saved `program`, else the built-in model's own."""
    if chosen:
        return tuple(chosen)
    if program:
        return PROGRAM_PRECISIONS
    if model in ONLY_PRECISIONS:
        return ONLY_PRECISIONS[model]
    if quick:
        return QUICK_PRECISIONS.get(model, QUICK_DEFAULT_PRECISIONS)
    return PRECISIONS + EXTRA_PRECISIONS.get(model, ())


def build_unit(model: str, variants: Sequence[str], precision: str, quick: bool, source: Any = None) -> List[Row]:
    """Build, quantize when `precision` is quantized, and lower `model` for HTP in every variant;
    run each ``.pte`` on the emulated HTP. `source`: the saved program `model` is
    (`benchmarks.saved_program.ProgramSource`), None for a built-in model. Never raises:
    failures and skips are in the rows.

    QnnQuantizer's and QNN's prints go to stderr (the worker log), not to the parent's output."""
    with contextlib.redirect_stdout(sys.stderr):
        return _build_unit(model, list(variants), precision, quick, source)


def _build_unit(model: str, variants: List[str], precision: str, quick: bool, source: Any = None) -> List[Row]:
    rows = {v: Row(model, v, "qnn", precision=precision) for v in variants}
    supported = [v for v in variants if v in VARIANT_MODES]
    for v in variants:
        if v not in VARIANT_MODES:
            rows[v].status = f"skipped: QNN rows are built for {', '.join(VARIANT_MODES)} only"
    if not supported:
        return list(rows.values())
    try:
        import qnn

        sdk = qnn.load_qnn_sdk()
    except Exception as exc:  # noqa: BLE001 - QnnSdkError (no qnn extra), or no QNN backend in executorch
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        for v in supported:
            rows[v].status = f"skipped: {why}"
        return list(rows.values())
    version = f"QNN {sdk.build_id} ({sdk.source})"
    from . import qnn_rows

    _worker.announce(f"{model} · qnn {precision} · " + ("export" if precision == "fp16" else "quantize"))
    start = time.perf_counter()
    try:
        spec = models.build(model, quick=quick, source=source)
        if precision == "fp16":
            # non-strict export first; the QNN wrapper's strict export then traces a plain GraphModule
            from .runner import export_model

            module = export_model(spec).module()
            quantize_time = None
        else:
            module = qnn_rows.quantize_for_htp(spec.program or spec.module, spec.inputs, precision)
            quantize_time = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001
        for v in supported:
            fail(rows[v], "export" if precision == "fp16" else "quantize", exc)
            rows[v].backend_version = version
        return list(rows.values())
    export_time = time.perf_counter() - start
    modes = [VARIANT_MODES[v] for v in supported]
    variant_of = {mode: v for v, mode in VARIANT_MODES.items()}
    with torch.no_grad():
        lowered = qnn_rows.lower_rows(
            model, module, spec.inputs, precision, modes, quantize_time_s=quantize_time,
            on_start=lambda mode: _worker.announce(f"{model} · qnn {precision} · {variant_of[mode]}"))
    for q in lowered:
        row = rows[variant_of[q.mode]]
        fill_row(row, q)
        row.note = "; ".join(filter(None, [spec.row_note, row.note])) or None
        row.backend_version = version
        row.export_time_s = export_time
    return list(rows.values())


def fill_row(row: Row, q: Any) -> None:
    """Copy a `benchmarks.qnn_rows.QnnRow` into `row`: the shared meanings (``.pte`` bytes, fold
    and lowering seconds, max abs diff against eager, the output's scale and the tolerance, the
    fold report, the first HTP run as the cold run) and QNN's own columns (the difference from
    the fold-off row's HTP output among them)."""
    row.status, row.traceback, row.qnn_error = q.status, q.traceback, q.qnn_error
    row.pte_bytes = q.pte_bytes
    row.fold_time_s = q.fold_time_s if q.fold_time_s is not None else (0.0 if q.mode == "off" else None)
    row.lower_time_s = q.lower_time_s
    row.quantize_time_s = q.quantize_time_s
    row.max_abs_diff, row.eager_max_abs, row.tolerance = q.htp_max_abs_diff, q.output_scale, q.tolerance
    row.tolerance_rule = q.tolerance_rule
    row.vs_off_max_abs_diff = q.htp_vs_off_max_abs_diff
    row.cold_run_ms = q.htp_run_ms
    row.partitions, row.refused_partitions, row.static_partitions = q.partitions, q.refused_partitions, q.static_partitions
    row.cpu_ops, row.cpu_op_reasons = q.cpu_ops, q.cpu_op_reasons
    row.constant_bytes_in_partitions, row.constant_bytes_on_cpu = q.constant_bytes_in_partitions, q.constant_bytes_on_cpu
    row.context_binary_bytes = q.context_binary_bytes
    row.peak_rss_bytes = q.peak_rss_bytes
    row.fold_report = q.fold_report
    if q.fold_report is not None:
        row.fold_bytes_before = q.fold_report.get("constant_bytes_before")
        row.fold_bytes_after = q.fold_report.get("constant_bytes_after")
        if not q.folds_changed_program:
            row.note = "the fold had nothing to do: no constant-only op left after QNN's export passes"
    row.mismatch_cause = q.mismatch_cause
    if q.mismatch_cause:
        row.note = "; ".join(filter(None, [row.note, q.mismatch_cause]))


def regressions(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``fold_constants`` QNN rows neither ``ok`` nor ``skipped`` whose status differs from the
    ``none`` row's of the same model and precision (a model QNN refuses either way is QNN's limit,
    not the fold's). Two ``error (<stage>)`` statuses are the same when the stage is; any other
    status (``mismatch: ...``) must be the same text, numbers included."""
    none = {(r["model"], r.get("precision")): r["status"] for r in rows
            if r["backend"] == "qnn" and r["variant"] == "none"}

    def stage(status: str) -> str:
        return status.split(")", 1)[0] if status.startswith("error (") else status

    return [r for r in rows if r["backend"] == "qnn" and r["variant"] == "fold_constants"
            and r["status"] != "ok" and not r["status"].startswith("skipped")
            and stage(none.get((r["model"], r.get("precision")), "ok")) != stage(r["status"])]


def sdk_text(rows: Sequence[Dict[str, Any]]) -> Optional[str]:
    """The QNN build the run's QNN rows used (``backend_version``), or None."""
    return next((r["backend_version"] for r in rows if r.get("backend") == "qnn" and r.get("backend_version")), None)
