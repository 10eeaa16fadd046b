"""QNN rows: each model lowered for Qualcomm HTP on the real backend (QNN 2.49.40, qnn/sdk.py),
fp16 and 8a8w (and llama in 16a4w), each three ways: fold off, executorch's
``constant_prop_pass``, and the fold stage.

``python -m benchmarks --qnn [--models ...] [--quick] [--out DIR]``

One row per (model, precision, mode): QNN partitions (and those the HTP rule refused), ops left
on the CPU, constant bytes entering QNN partitions and left on the CPU
(`qnn.describe_partitions`), the real ``.pte`` size and its change against fold off, the
emulated HTP's output against eager (`qnn.run_pte`; max abs difference and the output's scale,
max |eager output|; quantized rows against the converted q/dq program), and times.

Modes:
- ``off``: `qnn.to_edge_transform_and_lower_to_qnn` without the ``fold_constants`` spec;
- ``constant_prop_pass``: executorch's ``constant_prop_pass`` (exir/passes/constant_prop_pass.py)
  at the fold stage's position (after QNN's export passes, before QNN's to-edge passes, which
  are built from its result), then the stock ``to_edge_transform_and_lower``;
- ``on``: `qnn.to_edge_transform_and_lower_to_qnn` with ``fold_constants``.

A fold-off row may fail ("... was not decomposed or delegated": a constant-only op QNN keeps
whole, left on the CPU; or HTP's "No graph inputs present"); that is a result, recorded in the
row's status. Each (model, precision) runs in its own spawned process, one at a time, so a
crash or an out-of-memory kill loses only that pair's rows.
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

from . import _worker, models, quantized, report

logger = logging.getLogger(__name__)

PRECISIONS = ("fp16", "8a8w")
EXTRA_PRECISIONS = {"llama": ("16a4w",)}
MODES = ("off", "constant_prop_pass", "on")
# The benchmark models QNN rows are built for: the float ones (quantization is QNN's own).
MODELS = [name for name in models.BUILDERS if not name.endswith(quantized.SUFFIX)]
SOC_NAME = "SM8650"
TOP_CPU_OPS = 3
STATUS_CHARS = 110  # the table's status cell; the JSON and the Errors section keep the whole text
# Calibration batches besides the example input (seeded random, like benchmarks.quantized).
CALIBRATION_BATCHES = 2


@dataclasses.dataclass
class QnnRow:
    """One (model, precision, mode) lowering for QNN HTP.

    Attributes:
        mode: ``off``, ``constant_prop_pass`` or ``on`` (module docstring).
        status: "ok", or ``error (<stage>): <exception type>: <first line>``.
        partitions: QNN delegate calls in the lowered program.
        refused_partitions: partitions QNN's op support found but the HTP rule kept on the CPU
            (no runtime input, `qnn.htp_rule`).
        static_partitions: delegated partitions without a runtime input (0 on HTP).
        cpu_ops: op name -> count of the ops left outside any delegate.
        cpu_op_reasons: op name -> why QNN declined its nodes (``QnnPartitionReport.declined_by_qnn``,
            or the HTP rule's reason for a refused partition).
        constant_bytes_in_partitions / constant_bytes_on_cpu: see `qnn.PartitionSummary` (bytes).
        fold_time_s: the fold stage (``FoldReport.timings["total"]``) or ``constant_prop_pass``;
            None when off.
        naming_time_s: restoring unfolded Edge names (``QnnPartitionReport.naming_seconds``);
            part of `lower_time_s`. None unless mode is ``on``.
        lower_time_s: export + QNN passes + ``to_edge`` + partitioning + HTP compiles, fold excluded.
        quantize_time_s: quantized rows: export, ``prepare_pt2e``, calibration, ``convert_pt2e``
            (once per model and precision, shared by its rows).
        wall_time_s: the row (lowering, fold, ``.pte`` serialisation and the HTP run).
        pte_bytes: size of the ``.pte``.
        htp_max_abs_diff: max |emulated HTP output - eager output| over the float outputs.
        output_scale: max |eager output| over the same outputs.
        htp_integer_mismatch: fraction of integer output elements that differ from eager.
        qnn_error: a failed lowering: the first error QNN's libraries printed (e.g. HTP's graph
            prepare naming the op), which executorch's exception does not carry.
        htp_run_ms: one run of the ``.pte`` on the emulated HTP (first call, loading excluded).
    """

    model: str
    precision: str
    mode: str
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
    htp_max_abs_diff: Optional[float] = None
    output_scale: Optional[float] = None
    cpu_op_reasons: Optional[Dict[str, str]] = None
    qnn_error: Optional[str] = None
    htp_integer_mismatch: Optional[float] = None
    htp_run_ms: Optional[float] = None
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
    logger.warning("%s/%s/%s: %s", row.model, row.precision, row.mode, row.status)


def compiler_specs(precision: str, fold: bool) -> list:
    """HTP specs for `SOC_NAME` (fp16 or quantized), with ``fold_constants`` (default policy) when `fold`."""
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec

    import qnn

    options = generate_htp_compiler_spec(use_fp16=precision == "fp16")
    return qnn.generate_qnn_executorch_compiler_spec(getattr(QcomChipset, SOC_NAME), options, fold_constants=fold)


def quantize_for_htp(module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], precision: str) -> torch.fx.GraphModule:
    """PT2E with executorch's QnnQuantizer (``8a8w`` or ``16a4w``; per-channel conv and linear
    weights), calibrated on `CALIBRATION_BATCHES` seeded random batches and `inputs`. Nodes whose
    calibration values are not finite are left unquantized (`_non_finite_observed`).

    Export is non-strict (``torch.export.export``'s default; HF models do not trace strictly)."""
    import qnn  # noqa: F401  (sets QNN_SDK_ROOT: QnnQuantizer downloads an SDK when it is unset)
    from qnn.control_flow import require_no_control_flow
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, QnnExecuTorchBackendType
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    dtype = {"8a8w": QuantDtype.use_8a8w, "16a4w": QuantDtype.use_16a4w}[precision]
    discard: set = set()
    for _ in range(3):  # each round discards the nodes whose values could not be observed
        quantizer = QnnQuantizer(backend=QnnExecuTorchBackendType.kHtpBackend, soc_model=getattr(QcomChipset, SOC_NAME))
        quantizer.set_default_quant_config(dtype, is_conv_per_channel=True, is_linear_per_channel=True)
        quantizer.add_discard_nodes(sorted(discard))
        with torch.no_grad():
            program = torch.export.export(module.eval(), inputs, strict=False)
        require_no_control_flow(program)  # typed, not QNN's AttributeError
        prepared = prepare_pt2e(program.module(), quantizer)
        g = torch.Generator().manual_seed(models.SEED + 2)
        with torch.no_grad():
            for _ in range(CALIBRATION_BATCHES):
                prepared(*quantized._like(inputs, g))
            prepared(*inputs)
        unobservable = _non_finite_observed(prepared) - discard
        if not unobservable:
            return convert_pt2e(prepared)
        logger.info("not quantizing %s: non-finite values in calibration", sorted(unobservable))
        discard |= unobservable
    raise RuntimeError(f"calibration still sees non-finite values after discarding {sorted(discard)}")


def _non_finite_observed(prepared: torch.fx.GraphModule) -> set:
    """Names of the nodes whose output observer saw -inf, inf or NaN in calibration.

    Such a value has no quantization encoding (torchao's observers then fail with "min nan
    should be less than max"). T5's relative-position buckets compute ``log(0) = -inf`` on
    the way to an integer bucket; that code reads no runtime input and runs in float."""
    names = set()
    for node in prepared.graph.nodes:
        if node.op != "call_module" or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        observer = prepared.get_submodule(node.target)
        low, high = getattr(observer, "min_val", None), getattr(observer, "max_val", None)
        if isinstance(low, torch.Tensor) and low.numel() and not (
                torch.isfinite(low).all() and torch.isfinite(high).all()):
            names.add(node.args[0].name)  # the node observed, and those that read the observer
            names.update(user.name for user in node.users if user.op == "call_function")
    return names


def _lower_with_constant_prop_pass(module, inputs, specs, skip_node_op_set):
    """executorch's ``constant_prop_pass`` at the fold stage's position, then the stock flow.
    Returns (manager, partitioner, seconds in ``constant_prop_pass``)."""
    from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager
    from executorch.backends.qualcomm.utils.utils import qnn_edge_config
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    import qnn

    ep = QnnPassManager().transform_for_export_pipeline(torch.export.export(module, inputs, strict=True))
    start = time.perf_counter()
    ep = constant_prop_pass(ep)
    seconds = time.perf_counter() - start
    partitioner = qnn.QnnPartitioner(specs, skip_node_op_set=skip_node_op_set)
    manager = to_edge_transform_and_lower(ep, transform_passes=partitioner.default_to_edge_passes(ep),
                                          partitioner=[partitioner], compile_config=qnn_edge_config())
    return manager, partitioner, seconds


def _lower(row: QnnRow, module, inputs, skip_node_op_set):
    """Lower for `row.mode`; returns (manager, partitioner) and sets the row's fold time."""
    import qnn

    specs = compiler_specs(row.precision, row.mode == "on")
    if row.mode == "constant_prop_pass":
        manager, partitioner, row.fold_time_s = _lower_with_constant_prop_pass(module, inputs, specs, skip_node_op_set)
        return manager, partitioner
    manager = qnn.to_edge_transform_and_lower_to_qnn(module, inputs, specs, skip_node_op_set=skip_node_op_set)
    partitioner = manager.qnn_partitioners["forward"]
    if partitioner.fold_reports:
        row.fold_time_s = sum(r.timings.get("total", 0.0) for r in partitioner.fold_reports)
    return manager, partitioner


@contextlib.contextmanager
def _qnn_messages():
    """Collect the ``ERROR:`` lines QNN's C++ libraries print (file descriptors 1 and 2) while
    the block runs, most specific first (HTP's own ``file.cc:line::ERROR:`` lines before
    executorch's ``<E>`` summaries); everything printed still reaches the original stderr."""
    import tempfile

    messages: List[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        try:
            yield messages
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            capture.seek(0)
            text = capture.read().decode("utf-8", "replace")
            os.write(2, text.encode("utf-8"))
            lines = [line.strip() for line in text.splitlines() if "ERROR" in line]
            specific = [line.split("::ERROR:", 1)[1] for line in lines if "::ERROR:" in line]
            messages.extend(specific + [line for line in lines if "<E>" in line])


def _cpu_op_reasons(manager, decisions) -> Dict[str, str]:
    """Op name -> why its nodes left on the CPU are there: the HTP rule for a refused partition,
    else QNN's operator-support check (several reasons are joined)."""
    from folding.ops import op_name

    refused = {name: p.reason for p in decisions.refused for name in p.nodes}
    reasons: Dict[str, set] = {}
    for node in manager.exported_program().graph.nodes:
        if node.op != "call_function" or str(node.target) in ("executorch_call_delegate", "<built-in function getitem>"):
            continue
        why = refused.get(node.name) or decisions.declined_by_qnn.get(node.name, "not claimed by any partition")
        reasons.setdefault(op_name(node.target), set()).add(why)
    return {op: "; ".join(sorted(whys)) for op, whys in sorted(reasons.items())}


def _tensors(outputs) -> List[torch.Tensor]:
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [o for o in outputs if isinstance(o, torch.Tensor)]


def _run_on_htp(row: QnnRow, buffer: bytes, inputs, expected: List[torch.Tensor]) -> None:
    """Run the ``.pte`` on the emulated HTP; float outputs give `htp_max_abs_diff` and
    `output_scale`, integer outputs `htp_integer_mismatch` (fraction of elements that differ)."""
    import qnn

    start = time.perf_counter()
    got = _tensors(qnn.run_pte(buffer, inputs))
    row.htp_run_ms = (time.perf_counter() - start) * 1e3
    if len(got) != len(expected) or any(g.shape != w.shape for g, w in zip(got, expected)):
        raise ValueError(f"HTP outputs {[tuple(g.shape) for g in got]} != eager {[tuple(w.shape) for w in expected]}")
    floats = [(g, w) for g, w in zip(got, expected) if w.dtype.is_floating_point]
    ints = [(g, w) for g, w in zip(got, expected) if not w.dtype.is_floating_point]
    if floats:
        row.htp_max_abs_diff = max(float((g.float() - w.float()).abs().max()) for g, w in floats)
        row.output_scale = max(float(w.float().abs().max()) for _, w in floats)
    if ints:
        row.htp_integer_mismatch = sum(int((g != w).sum()) for g, w in ints) / sum(w.numel() for _, w in ints)


def lower_rows(model: str, module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], precision: str,
               modes: Sequence[str] = MODES, *, skip_node_op_set: Optional[set] = None,
               quantize_time_s: Optional[float] = None, run: bool = True) -> List[QnnRow]:
    """Lower `module` (already quantized for a quantized `precision`) for HTP once per mode,
    serialise the ``.pte`` and, when `run`, run it on the emulated HTP against `module`'s own
    outputs. Never raises: failures are recorded in the rows."""
    with torch.no_grad():
        expected = _tensors(module(*inputs))
    rows = []
    for mode in modes:
        row = QnnRow(model, precision, mode, quantize_time_s=quantize_time_s)
        rows.append(row)
        start = time.perf_counter()
        try:
            with _qnn_messages() as messages:
                manager, partitioner = _lower(row, module, inputs, skip_node_op_set)
        except Exception as exc:  # noqa: BLE001 - recorded in the row
            row.wall_time_s = row.lower_time_s = time.perf_counter() - start
            _error(row, "lower", exc)
            if messages:
                row.qnn_error = messages[0]
            continue
        import qnn

        row.lower_time_s = time.perf_counter() - start - (row.fold_time_s or 0.0)
        summary = qnn.describe_partitions(manager)
        row.partitions = summary.partitions
        row.cpu_ops = summary.cpu_ops
        row.constant_bytes_in_partitions = summary.constant_bytes_in_partitions
        row.constant_bytes_on_cpu = summary.constant_bytes_on_cpu
        if partitioner.reports:
            decisions = partitioner.reports[-1]
            row.refused_partitions = len(decisions.refused)
            if mode == "on":
                row.naming_time_s = decisions.naming_seconds
            row.static_partitions = sum(1 for p in decisions.delegated if not p.runtime_inputs)
            row.cpu_op_reasons = _cpu_op_reasons(manager, decisions)
        stage = "to_executorch"
        try:
            buffer = manager.to_executorch().buffer
            row.pte_bytes = len(buffer)
            del manager
            stage = "run on HTP"
            if run:
                _run_on_htp(row, buffer, inputs, expected)
        except Exception as exc:  # noqa: BLE001
            _error(row, stage, exc)
        row.wall_time_s = time.perf_counter() - start
    return rows


def precisions_of(model: str) -> Tuple[str, ...]:
    return PRECISIONS + EXTRA_PRECISIONS.get(model, ())


def run_unit(model: str, precision: str, quick: bool) -> List[Dict[str, Any]]:
    """One (model, precision): build, quantize when quantized, lower every mode. Never raises.

    Runs in a worker process. QnnQuantizer's and QNN's prints go to stderr, i.e. the worker
    log, not into the parent's table output."""
    with contextlib.redirect_stdout(sys.stderr):
        return _run_unit(model, precision, quick)


def _run_unit(model: str, precision: str, quick: bool) -> List[Dict[str, Any]]:
    import qnn

    rows = [QnnRow(model, precision, mode) for mode in MODES]
    try:
        qnn.load_qnn_sdk()
        spec = models.build(model, quick=quick)
        module, quantize_time = spec.module, None
        start = time.perf_counter()
        if precision != "fp16":
            module = quantize_for_htp(spec.module, spec.inputs, precision)
            quantize_time = time.perf_counter() - start
        else:
            # non-strict export first; the wrapper's strict export then traces a plain GraphModule
            with torch.no_grad():
                module = torch.export.export(spec.module, spec.inputs, strict=False).module()
    except Exception as exc:  # noqa: BLE001
        stage = "export" if precision == "fp16" else "quantize"
        for row in rows:
            _error(row, stage, exc)
        return [r.to_dict() for r in rows]
    with torch.no_grad():
        rows = lower_rows(model, module, spec.inputs, precision, quantize_time_s=quantize_time)
    return [r.to_dict() for r in rows]


def run_all(model_names: Sequence[str], quick: bool = False, log_path: Optional[str] = None,
            on_done: Callable[[Dict[str, Any]], None] = lambda row: None) -> List[Dict[str, Any]]:
    """Every (model, precision) in a fresh spawned process, one at a time; returns the row dicts.

    A worker that dies (crash, out of memory) fails only its own rows."""
    ctx = multiprocessing.get_context("spawn")
    rows: List[Dict[str, Any]] = []
    for model in model_names:
        for precision in precisions_of(model):
            try:
                with ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker.init, initargs=(log_path,)) as pool:
                    unit_rows = pool.submit(run_unit, model, precision, quick).result()
            except Exception as exc:  # noqa: BLE001 - a dead worker
                unit_rows = []
                for mode in MODES:
                    row = QnnRow(model, precision, mode)
                    _error(row, "worker", exc, tb="".join(traceback.format_exception(exc)))
                    unit_rows.append(row.to_dict())
            add_size_change(unit_rows)
            for row in unit_rows:
                rows.append(row)
                on_done(row)
    return rows


def regressions(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Fold-on rows that failed where fold off of the same model and precision did not fail at
    the same stage (a model QNN refuses either way is QNN's limit, not the fold stage's)."""
    off = {(r["model"], r["precision"]): r["status"] for r in rows if r["mode"] == "off"}

    def stage(status: str) -> str:
        return status.split(")", 1)[0] if status.startswith("error (") else status

    return [r for r in rows if r["mode"] == "on" and r["status"] != "ok"
            and stage(off.get((r["model"], r["precision"]), "ok")) != stage(r["status"])]


def add_size_change(rows: List[Dict[str, Any]]) -> None:
    """Set each row's ``pte_change``: its ``.pte`` bytes against the fold-off row of the same
    (model, precision), as a fraction (None when either has no ``.pte``)."""
    off = {(r["model"], r["precision"]): r.get("pte_bytes") for r in rows if r["mode"] == "off"}
    for r in rows:
        base = off.get((r["model"], r["precision"]))
        r["pte_change"] = (r["pte_bytes"] / base - 1.0) if base and r.get("pte_bytes") else None


# -- report ------------------------------------------------------------------------------

COLUMNS = [
    ("model", "model"),
    ("precision", "precision"),
    ("mode", "fold"),
    ("status", "status"),
    ("partitions", "QNN partitions (refused)"),
    ("cpu_ops", "ops left on CPU"),
    ("pte", ".pte bytes"),
    ("pte_change", "vs off"),
    ("htp_max_abs_diff", "HTP vs eager: max abs diff"),
    ("output_scale", "output scale"),
    ("fold_time_s", "fold s"),
    ("lower_time_s", "lower s"),
    ("wall_time_s", "row s"),
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
        text = str(row["status"]).replace("\n", " ")
        text = text if len(text) <= STATUS_CHARS else text[:STATUS_CHARS - 1] + "…"
        return text.replace("|", "\\|")
    if key == "partitions":
        n = report._int(row.get("partitions"))
        refused = row.get("refused_partitions")
        return n if not refused else f"{n} ({refused})"
    if key == "cpu_ops":
        return _cpu_ops_cell(row)
    if key == "pte":
        return report._int(row.get("pte_bytes"))
    if key == "pte_change":
        change = row.get("pte_change")
        return "—" if change is None else f"{change:+.2%}"
    if key in ("htp_max_abs_diff", "output_scale"):
        return report._float(row.get(key), ".3g")
    if key in ("fold_time_s", "lower_time_s"):
        return report._float(row.get(key), ".2f")
    if key == "wall_time_s":
        return report._float(row.get(key), ".1f")
    return str(row.get(key))


def header(sdk: Optional[str]) -> str:
    """The line above the table: which QNN build answered op support and compiled."""
    return (f"QNN HTP ({SOC_NAME}), real backend: {sdk}. Op validation and context binaries from "
            "QNN; `.pte` run on the x86-64 HTP emulation (`qnn.run_pte`).")


def to_markdown(rows: Sequence[Dict[str, Any]], sdk: Optional[str] = None) -> str:
    """Render QNN rows (`QnnRow.to_dict`) as a header line and a Markdown table."""
    lines = [header(sdk), "",
             "| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
    qnn_errors = [r for r in rows if r.get("qnn_error")]
    if qnn_errors:
        lines += ["", "What QNN said when a lowering failed:", ""]
        lines += [f"- {r['model']} {r['precision']} {r['mode']}: {r['qnn_error']}" for r in qnn_errors]
    why = [r for r in rows if r["mode"] == "on" and r.get("cpu_op_reasons")]
    if why:
        lines += ["", "Ops left on the CPU with folding on, and why:", ""]
        for r in why:
            reasons = "; ".join(f"`{op}`: {reason}" for op, reason in r["cpu_op_reasons"].items())
            lines.append(f"- {r['model']} {r['precision']}: {reasons}")
    return "\n".join(lines) + "\n"


def plot_pte_change(rows: Sequence[Dict[str, Any]], path: str) -> Optional[str]:
    """The QNN panels of the size chart: ``.pte`` change (%) against fold off, one panel per
    precision, a bar per (model, mode); "err" where the row failed, "off err" where fold off
    failed (nothing to compare with). Returns `path`, or None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    models_ = list(dict.fromkeys(r["model"] for r in rows))
    modes = [m for m in MODES if m != "off"]
    if not precisions or not models_:
        return None
    fig, axes = plt.subplots(1, len(precisions), figsize=(max(6, 1.6 * len(models_)) * len(precisions) / 1.4, 4.5),
                             squeeze=False)
    width = 0.8 / len(modes)
    for ax, precision in zip(axes[0], precisions):
        for i, mode in enumerate(modes):
            xs, ys = [], []
            for j, model in enumerate(models_):
                match = [r for r in rows if (r["model"], r["precision"], r["mode"]) == (model, precision, mode)]
                if not match:
                    continue
                x = j + (i - (len(modes) - 1) / 2) * width
                change = match[0].get("pte_change")
                if change is None:
                    off_failed = not any(r.get("pte_bytes") for r in rows
                                         if (r["model"], r["precision"], r["mode"]) == (model, precision, "off"))
                    text = "off err" if off_failed and match[0].get("pte_bytes") else "err"
                    ax.text(x, 0, text, ha="center", va="bottom", fontsize=6, color="red", rotation=90)
                    continue
                xs.append(x)
                ys.append(100 * change)
            bars = ax.bar(xs, ys, width, label=mode)
            ax.bar_label(bars, fmt="%+.2f", fontsize=6, padding=2)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(models_)))
        ax.set_xticklabels(models_, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"QNN HTP {precision}: .pte vs fold off", fontsize=10)
        ax.set_ylabel("% change (lower is smaller)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(rows: Sequence[Dict[str, Any]], out_dir: str, meta: Dict[str, Any],
              sdk: Optional[str] = None) -> Dict[str, str]:
    """Write ``qnn.json``, ``qnn.md`` (table, then the failed rows' tracebacks) and
    ``qnn_pte_size_change.png`` (`plot_pte_change`) into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "qnn.json"), "md": os.path.join(out_dir, "qnn.md")}
    report.write_json_and_md(paths["json"], paths["md"], "QNN benchmark rows", to_markdown(rows, sdk), rows, meta,
                             lambda r: f"{r['model']} / {r['precision']} / {r['mode']}")
    try:
        png = plot_pte_change(rows, os.path.join(out_dir, "qnn_pte_size_change.png"))
        if png:
            paths["png"] = png
    except Exception:  # noqa: BLE001 - a broken chart must not lose the results
        logger.exception("could not draw the QNN chart")
    return paths
