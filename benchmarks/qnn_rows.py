"""QNN rows: each model lowered for Qualcomm HTP, fp16 and 8a8w, with and without the fold stage.

``python -m benchmarks --qnn [--models ...] [--quick] [--out DIR]``

One row per (model, precision, fold): QNN partitions, ops left on the CPU, constant bytes
entering QNN partitions and left on the CPU (`qnn.describe_partitions`), the fold stage's time
(its `FoldReport` timings, as run inside `qnn.to_edge_transform_and_lower_to_qnn`), the rest of
the lowering's time and, when the Qualcomm SDK is present, the ``.pte`` size. Without the SDK,
op support comes from `qnn.testing.sdk_stand_in` (QNN's op table) and no context binary is
compiled, so the ``.pte`` size is not reported (the table says why).

A fold-off row may fail ("... was not decomposed or delegated": a constant-only op QNN keeps
whole, refused by HTP, left on the CPU); that is a result, recorded in the row's status.
Each (model, precision) runs in its own spawned process, one at a time, so a crash or an
out-of-memory kill loses only that pair's rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from qnn.testing.sdk_stand_in import real_sdk_root, use_no_sdk_download

from . import _worker, models, quantized, report

logger = logging.getLogger(__name__)

PRECISIONS = ("fp16", "8a8w")
FOLDS = (False, True)
# The benchmark models QNN rows are built for: the float ones (8a8w is QNN's own quantization).
MODELS = [name for name in models.BUILDERS if not name.endswith(quantized.SUFFIX)]
QUICK_MODELS = ["mobilenet_v3_small", "llama"]
SOC_NAME = "SM8650"
TOP_CPU_OPS = 3
# Calibration batches for 8a8w besides the example input (seeded random, like benchmarks.quantized).
CALIBRATION_BATCHES = 2

NO_SDK_PTE = "n/a: no QNN SDK (op support from QNN's op table stand-in; context binary not compiled)"
NO_SDK_HEADER = ("Without the Qualcomm QNN SDK: op support answered by `qnn.testing.sdk_stand_in` "
                 "(an op is supported when QNN's node visitor builds it and QNN's op table defines "
                 "it), context binaries not compiled, so no `.pte` size.")


@dataclasses.dataclass
class QnnRow:
    """One (model, precision, fold) lowering for QNN HTP.

    Attributes:
        status: "ok", or ``error (<stage>): <exception type>: <first line>``.
        partitions: QNN delegate calls in the lowered program.
        refused_partitions: partitions QNN's op support found but the HTP rule kept on the CPU
            (no runtime input, `qnn.htp_rule`).
        static_partitions: delegated partitions without a runtime input (0 on HTP).
        cpu_ops: op name -> count of the ops left outside any delegate.
        constant_bytes_in_partitions / constant_bytes_on_cpu: see `qnn.PartitionSummary` (bytes).
        fold_time_s: the fold stage (``FoldReport.timings["total"]``); None when folding is off.
        naming_time_s: giving the folded program's Edge nodes their unfolded names
            (``QnnPartitionReport.naming_seconds``: one more ``to_edge`` + QNN to-edge passes
            of the unfolded program, `qnn.names`; 0 unless names are restored); part of
            `lower_time_s`. None when folding is off.
        lower_time_s: export + QNN passes + ``to_edge`` + partitioning + preprocess, fold excluded.
        quantize_time_s: 8a8w only: export, ``prepare_pt2e``, calibration, ``convert_pt2e``
            (done once per model, shared by its two rows).
        wall_time_s: the whole row (lowering, fold and ``.pte`` serialisation; not quantization).
        pte_bytes: size of the ``.pte`` (real SDK only); `pte` is the cell text either way.
    """

    model: str
    precision: str
    fold: bool
    status: str = "ok"
    partitions: Optional[int] = None
    refused_partitions: Optional[int] = None
    static_partitions: Optional[int] = None
    cpu_ops: Optional[Dict[str, int]] = None
    constant_bytes_in_partitions: Optional[int] = None
    constant_bytes_on_cpu: Optional[int] = None
    fold_time_s: Optional[float] = None
    naming_time_s: Optional[float] = None
    lower_time_s: Optional[float] = None
    quantize_time_s: Optional[float] = None
    wall_time_s: Optional[float] = None
    pte_bytes: Optional[int] = None
    pte: str = NO_SDK_PTE
    traceback: Optional[str] = None

    @property
    def cpu_op_count(self) -> Optional[int]:
        return None if self.cpu_ops is None else sum(self.cpu_ops.values())

    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cpu_op_count"] = self.cpu_op_count
        return d


def _error(row: QnnRow, stage: str, exc: BaseException, tb: Optional[str] = None) -> None:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    row.status = f"error ({stage}): {type(exc).__name__}: {first}"[:300]
    row.traceback = tb or traceback.format_exc()
    logger.warning("%s/%s/fold %s: %s", row.model, row.precision, "on" if row.fold else "off", row.status)


def compiler_specs(precision: str, fold: bool) -> list:
    """HTP specs for `SOC_NAME` (fp16 or quantized), with ``fold_constants`` (default policy) when `fold`."""
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec

    import qnn

    options = generate_htp_compiler_spec(use_fp16=precision == "fp16")
    return qnn.generate_qnn_executorch_compiler_spec(getattr(QcomChipset, SOC_NAME), options, fold_constants=fold)


def quantize_8a8w(module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """PT2E with executorch's QnnQuantizer (8-bit activations and weights, per-channel conv and
    linear weights), calibrated on `CALIBRATION_BATCHES` seeded random batches and `inputs`.

    Export is non-strict (``torch.export.export``'s default; HF models do not trace strictly)."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=getattr(QcomChipset, SOC_NAME))
    quantizer.set_default_quant_config(QuantDtype.use_8a8w, is_conv_per_channel=True, is_linear_per_channel=True)
    with torch.no_grad():
        graph_module = torch.export.export(module.eval(), inputs, strict=False).module()
    prepared = prepare_pt2e(graph_module, quantizer)
    g = torch.Generator().manual_seed(models.SEED + 2)
    with torch.no_grad():
        for _ in range(CALIBRATION_BATCHES):
            prepared(*quantized._like(inputs, g))
        prepared(*inputs)
    return convert_pt2e(prepared)


def lower_rows(model: str, module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], precision: str,
               folds: Sequence[bool] = FOLDS, *, skip_node_op_set: Optional[set] = None,
               quantize_time_s: Optional[float] = None) -> List[QnnRow]:
    """Lower `module` (already quantized for 8a8w) for HTP once per fold setting. Never raises.

    Uses whatever QNN manager is in place: the caller enters
    `qnn.testing.sdk_stand_in.qnn_sdk_stand_in` when there is no SDK. The ``.pte`` is serialised only with the real SDK (`real_sdk_root`).
    """
    import qnn

    rows = []
    for fold in folds:
        row = QnnRow(model, precision, fold, quantize_time_s=quantize_time_s)
        rows.append(row)
        start = time.perf_counter()
        try:
            manager = qnn.to_edge_transform_and_lower_to_qnn(
                module, inputs, compiler_specs(precision, fold), skip_node_op_set=skip_node_op_set)
        except Exception as exc:  # noqa: BLE001 - recorded in the row
            row.wall_time_s = row.lower_time_s = time.perf_counter() - start
            _error(row, "lower", exc)
            continue
        elapsed = time.perf_counter() - start
        partitioner = manager.qnn_partitioners["forward"]
        if partitioner.fold_reports:
            row.fold_time_s = sum(r.timings.get("total", 0.0) for r in partitioner.fold_reports)
        row.lower_time_s = elapsed - (row.fold_time_s or 0.0)
        summary = qnn.describe_partitions(manager)
        row.partitions = summary.partitions
        row.cpu_ops = summary.cpu_ops
        row.constant_bytes_in_partitions = summary.constant_bytes_in_partitions
        row.constant_bytes_on_cpu = summary.constant_bytes_on_cpu
        if partitioner.reports:
            decisions = partitioner.reports[-1]
            row.refused_partitions = len(decisions.refused)
            if row.fold:
                row.naming_time_s = decisions.naming_seconds
            row.static_partitions = sum(1 for p in decisions.delegated if not p.runtime_inputs)
        if real_sdk_root():
            try:
                row.pte_bytes = len(manager.to_executorch().buffer)
                row.pte = f"{row.pte_bytes:,}"
            except Exception as exc:  # noqa: BLE001
                _error(row, "to_executorch", exc)
                row.pte = "—"
        row.wall_time_s = time.perf_counter() - start
        del manager
    return rows


def run_unit(model: str, precision: str, quick: bool) -> List[Dict[str, Any]]:
    """One (model, precision): build, quantize for 8a8w, lower fold off and on. Never raises.

    Runs in a worker process; without the SDK inside `qnn.testing.sdk_stand_in.qnn_sdk_stand_in`.
    QnnQuantizer prints ("No quant config is implemented for op ...") go to stderr, i.e. the
    worker log, not into the parent's table output."""
    with contextlib.redirect_stdout(sys.stderr):
        return _run_unit(model, precision, quick)


def _run_unit(model: str, precision: str, quick: bool) -> List[Dict[str, Any]]:
    use_no_sdk_download()
    from qnn.testing.sdk_stand_in import qnn_sdk_stand_in

    rows = [QnnRow(model, precision, fold) for fold in FOLDS]
    try:
        spec = models.build(model, quick=quick)
        module, quantize_time = spec.module, None
        start = time.perf_counter()
        if precision == "8a8w":
            module = quantize_8a8w(spec.module, spec.inputs)
            quantize_time = time.perf_counter() - start
        else:
            # non-strict export first; the wrapper's strict export then traces a plain GraphModule
            with torch.no_grad():
                module = torch.export.export(spec.module, spec.inputs, strict=False).module()
    except Exception as exc:  # noqa: BLE001
        stage = "quantize" if precision == "8a8w" else "export"
        for row in rows:
            _error(row, stage, exc)
        return [r.to_dict() for r in rows]
    stand_in = contextlib.nullcontext() if real_sdk_root() else qnn_sdk_stand_in()
    with stand_in, torch.no_grad():
        rows = lower_rows(model, module, spec.inputs, precision, quantize_time_s=quantize_time)
    return [r.to_dict() for r in rows]


def run_all(model_names: Sequence[str], precisions: Sequence[str] = PRECISIONS, quick: bool = False,
            log_path: Optional[str] = None,
            on_done: Callable[[Dict[str, Any]], None] = lambda row: None) -> List[Dict[str, Any]]:
    """Every (model, precision) in a fresh spawned process, one at a time; returns the row dicts.

    A worker that dies (crash, out of memory) fails only its own rows."""
    use_no_sdk_download()  # inherited by the spawned workers
    ctx = multiprocessing.get_context("spawn")
    rows: List[Dict[str, Any]] = []
    for model in model_names:
        for precision in precisions:
            try:
                with ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker.init, initargs=(log_path,)) as pool:
                    unit_rows = pool.submit(run_unit, model, precision, quick).result()
            except Exception as exc:  # noqa: BLE001 - a dead worker
                unit_rows = []
                for fold in FOLDS:
                    row = QnnRow(model, precision, fold)
                    _error(row, "worker", exc, tb="".join(traceback.format_exception(exc)))
                    unit_rows.append(row.to_dict())
            for row in unit_rows:
                rows.append(row)
                on_done(row)
    return rows


# -- report ------------------------------------------------------------------------------

COLUMNS = [
    ("model", "model"),
    ("precision", "precision"),
    ("fold", "fold"),
    ("status", "status"),
    ("partitions", "QNN partitions (refused)"),
    ("cpu_ops", "ops left on CPU"),
    ("constant_bytes_in_partitions", "const bytes → QNN"),
    ("constant_bytes_on_cpu", "const bytes on CPU"),
    ("fold_time_s", "fold s"),
    ("naming_time_s", "names s"),
    ("lower_time_s", "lower s"),
    ("wall_time_s", "row s"),
    ("pte", ".pte bytes"),
]


def _cpu_ops_cell(row: Dict[str, Any]) -> str:
    ops = row.get("cpu_ops")
    if ops is None:
        return "—"
    top = Counter(ops).most_common(TOP_CPU_OPS)
    names = ", ".join(f"{name.removeprefix('aten.').removesuffix('.default')}×{n}" for name, n in top)
    more = ", …" if len(ops) > TOP_CPU_OPS else ""
    return f"{sum(ops.values())}" + (f": {names}{more}" if ops else "")


def _cell(row: Dict[str, Any], key: str) -> str:
    if key == "status":
        return str(row["status"]).replace("|", "\\|").replace("\n", " ")
    if key == "fold":
        return "on" if row["fold"] else "off"
    if key == "partitions":
        n = report._int(row.get("partitions"))
        refused = row.get("refused_partitions")
        return n if not refused else f"{n} ({refused})"
    if key == "cpu_ops":
        return _cpu_ops_cell(row)
    if key in ("constant_bytes_in_partitions", "constant_bytes_on_cpu"):
        return report._int(row.get(key))
    if key in ("fold_time_s", "naming_time_s", "lower_time_s"):
        return report._float(row.get(key), ".2f")
    if key == "wall_time_s":
        return report._float(row.get(key), ".1f")
    if key == "pte":
        return str(row.get("pte", "—")).replace("|", "\\|")
    return str(row.get(key))


def header(sdk_root: Optional[str]) -> str:
    """The line above the table saying where op support and the ``.pte`` come from."""
    if sdk_root:
        return f"Qualcomm QNN SDK at `{sdk_root}`: op support and context binaries from the SDK."
    return NO_SDK_HEADER


def to_markdown(rows: Sequence[Dict[str, Any]], sdk_root: Optional[str] = None) -> str:
    """Render QNN rows (`QnnRow.to_dict`) as a header line and a Markdown table."""
    lines = [f"QNN HTP ({SOC_NAME}). {header(sdk_root)}", "",
             "| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def write_all(rows: Sequence[Dict[str, Any]], out_dir: str, meta: Dict[str, Any],
              sdk_root: Optional[str] = None) -> Dict[str, str]:
    """Write ``qnn.json`` and ``qnn.md`` (table, then the failed rows' tracebacks) into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "qnn.json"), "md": os.path.join(out_dir, "qnn.md")}
    report.write_json_and_md(paths["json"], paths["md"], "QNN benchmark rows", to_markdown(rows, sdk_root), rows, meta,
                             lambda r: f"{r['model']} / {r['precision']} / fold {'on' if r['fold'] else 'off'}")
    return paths
