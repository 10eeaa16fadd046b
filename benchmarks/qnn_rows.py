"""Lowering one model for Qualcomm HTP on the real backend (QNN 2.49.40, qnn/sdk.py) in each
fold mode, and what QNN made of it: the records behind the ``qnn`` rows of the main benchmark
(`benchmarks.qnn_unit` turns them into `benchmarks.runner.Row`s) and the model zoo's QNN cell.

One `QnnRow` per (model, precision, mode): QNN partitions (and those the HTP rule refused), ops
left on the CPU, constant bytes entering QNN partitions and left on the CPU
(`qnn.describe_partitions`), the bytes of the HTP context binaries, the real ``.pte`` size, the
emulated HTP's output against eager (`qnn.run_pte`; max abs difference and the output's scale,
max |eager output|; quantized rows against the converted q/dq program) judged at the
precision's tolerance (`benchmarks.verdict`), the fold-on and ``constant_prop_pass`` rows' HTP
output against the fold-off row's on the same inputs, times and peak RSS.

A row that lowers and runs is ``ok`` only when its HTP output is within the tolerance of eager
and, for a row that folds, of the fold-off row's HTP output: by the triangle inequality a
fold-on row that passes the second check is never farther from eager than the fold-off row by
more than the tolerance.

Modes:
- ``off``: `qnn.to_edge_transform_and_lower_to_qnn` without the ``fold_constants`` spec;
- ``constant_prop_pass``: executorch's ``constant_prop_pass`` (exir/passes/constant_prop_pass.py)
  at the fold stage's position (after QNN's export passes, before QNN's to-edge passes, which
  are built from its result), then the stock ``to_edge_transform_and_lower``;
- ``on``: `qnn.to_edge_transform_and_lower_to_qnn` with ``fold_constants``.

A fold-off row may fail ("... was not decomposed or delegated": a constant-only op QNN keeps
whole, left on the CPU; or HTP's "No graph inputs present"); that is a result, recorded in the
row's status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import models, quantized
from .peak_memory import hwm_bytes, reset_hwm

logger = logging.getLogger(__name__)

MODES = ("off", "constant_prop_pass", "on")
SOC_NAME = "SM8650"
# Calibration batches besides the example input (seeded random, like benchmarks.quantized).
CALIBRATION_BATCHES = 2


@dataclasses.dataclass
class QnnRow:
    """One (model, precision, mode) lowering for QNN HTP.

    Attributes:
        mode: ``off``, ``constant_prop_pass`` or ``on`` (module docstring).
        status: "ok"; ``mismatch: ...`` or ``unverified: ...`` (`benchmarks.verdict.judge`, against
            eager, then against the fold-off row); or ``error (<stage>): <exception type>: <first line>``.
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
        tolerance: the largest ``htp_max_abs_diff`` still ``ok`` (`benchmarks.verdict.tolerance_of`).
        tolerance_rule: the bound that gave `tolerance` (``Tolerance.rule``: a fraction of the
            scale, or for fp16 a multiple of the model's emulated fp16 error).
        fp16_emulation_error: an fp16 row whose emulation failed (it is then judged at the
            floor): the exception, else None.
        htp_vs_off_max_abs_diff: max |this row's HTP output - the fold-off row's HTP output| over
            the float outputs, on the same inputs (None for ``off``, or when ``off`` did not run).
        htp_vs_off_integer_mismatch: fraction of integer output elements that differ from ``off``'s.
        mismatch_cause: for a row that missed eager, the known fault outside this project whose
            model the HTP output matches (`benchmarks.htp_faults.attribute`), else None.
        qnn_error: a failed lowering: the first error QNN's libraries printed (e.g. HTP's graph
            prepare naming the op), which executorch's exception does not carry.
        htp_run_ms: one run of the ``.pte`` on the emulated HTP (first call, loading excluded).
        context_binary_bytes: bytes of the HTP context binaries (the QNN delegates' payloads)
            inside the ``.pte``.
        peak_rss_bytes: peak resident set size of the process while this row was lowered,
            serialised and run (bytes; the kernel's mark is reset at the row's start).
        fold_report: ``FoldReport.to_dict()`` of the fold stage's last fold (mode ``on``).
        folds_changed_program: some fold of the lowering (the early control-flow fold included)
            lifted a constant or removed a placeholder (mode ``on``).
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
    tolerance: Optional[float] = None
    tolerance_rule: Optional[str] = None
    fp16_emulation_error: Optional[str] = None
    htp_vs_off_max_abs_diff: Optional[float] = None
    htp_vs_off_integer_mismatch: Optional[float] = None
    mismatch_cause: Optional[str] = None
    htp_run_ms: Optional[float] = None
    context_binary_bytes: Optional[int] = None
    peak_rss_bytes: Optional[int] = None
    fold_report: Optional[Dict[str, Any]] = None
    folds_changed_program: Optional[bool] = None  # any fold (the early control-flow one included) lifted or removed
    traceback: Optional[str] = None

    @property
    def cpu_op_count(self) -> Optional[int]:
        return None if self.cpu_ops is None else sum(self.cpu_ops.values())

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a dict, without `fold_report` (the benchmark row carries it: `benchmarks.qnn_unit`)."""
        d = dataclasses.asdict(self)
        d.pop("fold_report")
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


def quantize_for_htp(module: "torch.nn.Module | torch.export.ExportedProgram", inputs: Tuple[torch.Tensor, ...],
                     precision: str) -> torch.fx.GraphModule:
    """PT2E with executorch's QnnQuantizer (``8a8w`` or ``16a4w``; per-channel conv and linear
    weights), calibrated on `CALIBRATION_BATCHES` seeded random batches and `inputs`. Nodes whose
    calibration values are not finite are left unquantized (`_non_finite_observed`).

    Export is non-strict (``torch.export.export``'s default; HF models do not trace strictly);
    an ``ExportedProgram`` (a saved program, `benchmarks.saved_program`) is quantized as it is."""
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
        program = module if isinstance(module, torch.export.ExportedProgram) else _export_eval(module, inputs)
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


def _export_eval(module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...]) -> "torch.export.ExportedProgram":
    with torch.no_grad():
        return torch.export.export(module.eval(), inputs, strict=False)


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
    partitioner = qnn.qnn_partitioners(manager)["forward"]
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
    from folding.core.ops import op_name

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


def _differences(got: List[torch.Tensor], want: List[torch.Tensor]) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(max abs diff over the float outputs, max |want| over them, fraction of integer elements that
    differ); None where there is no output of that kind.

    Raises:
        ValueError: the outputs' count or shapes differ."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
        raise ValueError(f"HTP outputs {[tuple(g.shape) for g in got]} != {[tuple(w.shape) for w in want]}")
    floats = [(g, w) for g, w in zip(got, want) if w.dtype.is_floating_point]
    ints = [(g, w) for g, w in zip(got, want) if not w.dtype.is_floating_point]
    diff = max((float((g.float() - w.float()).abs().max()) for g, w in floats), default=None)
    scale = max((float(w.float().abs().max()) for _, w in floats), default=None)
    mismatch = sum(int((g != w).sum()) for g, w in ints) / sum(w.numel() for _, w in ints) if ints else None
    return diff, scale, mismatch


def _run_on_htp(row: QnnRow, buffer: bytes, inputs, expected: List[torch.Tensor],
                fold_off: Optional[List[torch.Tensor]], module: Optional[torch.nn.Module] = None,
                fold_off_ok: bool = True) -> List[torch.Tensor]:
    """Run the ``.pte`` on the emulated HTP and judge it (`benchmarks.verdict`): against eager
    (`htp_max_abs_diff`, `output_scale`, `htp_integer_mismatch`; an fp16 row by the bound of the
    model's own fp16 arithmetic when `module` is given, `tolerance_rule` naming the bound), then
    against the fold-off row's HTP outputs `fold_off` when given; that second check decides the
    status only when the fold-off row itself matched eager (`fold_off_ok`): a fold that makes
    HTP compute what fold off computed wrong, e.g. a batch norm folded out of reach of QNN's
    BatchNorm builder, is not a mismatch. A miss of eager is attributed to a known fault
    (`benchmarks.htp_faults`) when `module`, the eager reference, is given. Returns the HTP
    outputs."""
    from . import htp_faults, verdict

    import qnn

    start = time.perf_counter()
    got = _tensors(qnn.run_pte(buffer, inputs))
    row.htp_run_ms = (time.perf_counter() - start) * 1e3
    row.htp_max_abs_diff, row.output_scale, row.htp_integer_mismatch = _differences(got, expected)
    fp16_error = _fp16_error(row, module, inputs, expected)
    bound = None
    if row.output_scale is not None:
        bound = verdict.tolerance_of(row.precision, row.output_scale, row.htp_max_abs_diff, fp16_error)
        row.tolerance, row.tolerance_rule = bound.limit, bound.rule
    row.status = verdict.judge(row.precision, row.htp_max_abs_diff, row.output_scale, row.htp_integer_mismatch,
                               bound=bound)
    if row.status.startswith("mismatch") and module is not None:
        row.mismatch_cause = htp_faults.attribute(module, inputs, got, row.precision)
    if fold_off is not None:
        row.htp_vs_off_max_abs_diff, _, row.htp_vs_off_integer_mismatch = _differences(got, fold_off)
        vs_off = verdict.judge(row.precision, row.htp_vs_off_max_abs_diff, row.output_scale,
                               row.htp_vs_off_integer_mismatch, what="fold off on HTP", fp16_error=fp16_error)
        if row.status == "ok" and vs_off != "ok" and fold_off_ok:
            row.status = vs_off
    if row.status != "ok":
        logger.warning("%s/%s/%s: %s", row.model, row.precision, row.mode, row.status)
    return got


def _fp16_error(row: QnnRow, module: Optional[torch.nn.Module], inputs, expected: List[torch.Tensor]):
    """For an fp16 row with its eager `module`: a function giving the model's max abs error in
    fp16 arithmetic on the CPU (`benchmarks.fp16_emulation`), computed once on first call;
    None (recorded in ``fp16_emulation_error``) if the emulation fails. Else None."""
    if row.precision != "fp16" or module is None:
        return None
    cache: List[Optional[float]] = []

    def error() -> Optional[float]:
        if not cache:
            from . import fp16_emulation

            try:
                cache.append(fp16_emulation.fp16_error(module, inputs, expected))
            except Exception as exc:  # noqa: BLE001 - the row is then judged at the floor
                row.fp16_emulation_error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                logger.warning("%s/%s/%s: fp16 emulation failed: %s", row.model, row.precision, row.mode,
                               row.fp16_emulation_error)
                cache.append(None)
        return cache[0]

    return error


def lower_rows(model: str, module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], precision: str,
               modes: Sequence[str] = MODES, *, skip_node_op_set: Optional[set] = None,
               quantize_time_s: Optional[float] = None, run: bool = True,
               on_start: Callable[[str], None] = lambda mode: None) -> List[QnnRow]:
    """Lower `module` (already quantized for a quantized `precision`) for HTP once per mode,
    serialise the ``.pte`` and, when `run`, run it on the emulated HTP against `module`'s own
    outputs. ``on_start(mode)`` is called as each mode starts. Never raises: failures are
    recorded in the rows."""
    with torch.no_grad():
        expected = _tensors(module(*inputs))
    rows, fold_off, fold_off_ok = [], None, True
    for mode in sorted(modes, key=lambda m: m != "off"):  # off first: the others are compared with it
        on_start(mode)
        row = QnnRow(model, precision, mode, quantize_time_s=quantize_time_s)
        rows.append(row)
        reset_hwm()
        start = time.perf_counter()
        outputs = _lower_one(row, module, inputs, expected, skip_node_op_set, run, start, fold_off, fold_off_ok)
        if mode == "off":
            fold_off, fold_off_ok = outputs, row.status == "ok"
        row.peak_rss_bytes = hwm_bytes()
    return sorted(rows, key=lambda r: list(modes).index(r.mode))


def _lower_one(row: QnnRow, module, inputs, expected, skip_node_op_set, run: bool, start: float,
               fold_off: Optional[List[torch.Tensor]], fold_off_ok: bool = True) -> Optional[List[torch.Tensor]]:
    """One mode of `lower_rows`, filling `row`; returns its HTP outputs (None if it did not run)."""
    mode = row.mode
    try:
        with _qnn_messages() as messages:
            manager, partitioner = _lower(row, module, inputs, skip_node_op_set)
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        row.wall_time_s = row.lower_time_s = time.perf_counter() - start
        _error(row, "lower", exc)
        if messages:
            row.qnn_error = messages[0]
        return None
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
    if partitioner.fold_reports:
        row.fold_report = partitioner.fold_reports[-1].to_dict()
        row.folds_changed_program = any(r.lifted or r.removed_placeholders for r in partitioner.fold_reports)
    row.context_binary_bytes = context_binary_bytes(manager)
    stage, outputs = "to_executorch", None
    try:
        buffer = manager.to_executorch().buffer
        row.pte_bytes = len(buffer)
        del manager
        stage = "run on HTP"
        if run:
            outputs = _run_on_htp(row, buffer, inputs, expected, fold_off, module, fold_off_ok)
    except Exception as exc:  # noqa: BLE001
        _error(row, stage, exc)
    row.wall_time_s = time.perf_counter() - start
    return outputs


def context_binary_bytes(manager) -> int:
    """Bytes of the QNN delegates' payloads (HTP context binaries) of a lowered program, control-flow
    bodies included: what the ``.pte`` stores for HTP besides its own constants."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    total = 0
    for name in manager.methods:
        module = manager.exported_program(name).graph_module
        total += sum(len(m.processed_bytes) for _, m in module.named_modules()
                     if isinstance(m, LoweredBackendModule) and m.backend_id == "QnnBackend")
    return total


def header(sdk: Optional[str]) -> str:
    """The line above the table: which QNN build answered op support and compiled."""
    return (f"QNN HTP ({SOC_NAME}), real backend: {sdk}. Op validation and context binaries from "
            "QNN; `.pte` run on the x86-64 HTP emulation (`qnn.run_pte`).")
