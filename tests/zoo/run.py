"""One zoo model, every step: the row record and the steps that fill it.

`run_model(name, checkpoint)` builds the model, computes the eager reference and then, each step
guarded (a failure is recorded in the row and the next step runs):

1. ``export``: ``torch.export.export(strict=False)``; a failure here is the model's or torch's,
   not ours, and ends the row.
2. ``aten``: ``folding.fold_constants`` and ExecuTorch's ``constant_prop_pass`` (on a deep copy;
   it mutates) on the ATen program; each folded program is run and compared with eager.
3. ``edge``: the same on ``to_edge(program)`` (Edge dialect, default ``EdgeCompileConfig``;
   ``constant_prop_pass(_skip_dim_order=False)`` to match it).
4. ``xnnpack``: ``to_edge_transform_and_lower(..., [XnnpackPartitioner()])`` of the program
   unfolded, with ``fold_constants`` and with ``constant_prop_pass`` as the benchmark does it
   (`benchmarks.variants`), serialised, loaded with ``_load_for_executorch_from_buffer`` and run.
5. ``qnn``: HTP fp16 with ``fold_constants`` on (`benchmarks.qnn_rows.lower_rows`) on the real
   HTP backend (qnn/sdk.py), the ``.pte`` run on the emulated HTP and compared with eager.

After each step the row is written to `checkpoint` (JSON), so a process killed by a timeout or a
crash still leaves the steps it finished.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional, Sequence

import torch
from torch.export import ExportedProgram

from benchmarks import graph_stats
from .compare import PROGRAM_TOL, PTE_TOL, as_tensors, compare
from .models import ZooSpec, build

FOLDERS = ("fold_constants", "constant_prop_pass")
XNNPACK_VARIANTS = ("none", "fold_constants", "constant_prop_pass")
DIALECTS = ("aten", "edge")
from .pool import STEPS  # noqa: E402,F401  (one definition, importable without torch)
TRACEBACK_CHARS = 6000


def error_text(exc: BaseException) -> str:
    """``<type>: <first line of the message>`` (at most 300 characters)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _tb() -> str:
    return traceback.format_exc()[-TRACEBACK_CHARS:]


def new_row(name: str) -> Dict[str, Any]:
    """An empty row for model `name`; `run_model` fills it step by step."""
    return {
        "model": name, "family": None, "note": None, "step": None, "done": False, "wall_time_s": None,
        "build_error": None, "export_ok": None, "export_error": None, "export_time_s": None,
        "aten_nodes": None, "aten_const_only_nodes": None, "export_diff": None,
        "aten": {}, "edge": {}, "edge_error": None, "edge_nodes": None, "edge_const_only_nodes": None,
        "xnnpack": {}, "qnn": None, "steps": list(STEPS), "worker_error": None, "tracebacks": {},
    }


def _fold(folder: str, program: ExportedProgram, dialect: str):
    """Fold `program` with `folder`; returns the folded program (the caller's is unchanged)."""
    if folder == "fold_constants":
        from folding import fold_constants

        return fold_constants(program).program
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    return constant_prop_pass(copy.deepcopy(program), _skip_dim_order=dialect == "aten")


def fold_and_compare(folder: str, program: ExportedProgram, dialect: str, inputs: Sequence[torch.Tensor],
                     expected: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """Fold `program` with `folder`, run the result on `inputs` and compare with `expected`."""
    cell: Dict[str, Any] = {"ok": False, "error": None, "match": None}
    start = time.perf_counter()
    try:
        folded = _fold(folder, program, dialect)
        cell["time_s"] = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        cell.update(error=f"fold: {error_text(exc)}", traceback=_tb(), time_s=time.perf_counter() - start)
        return cell
    stats = graph_stats.summarize(folded)
    cell.update(nodes=stats["nodes"], const_only_nodes=stats["const_only_nodes"], const_bytes=stats["const_bytes"])
    try:
        with torch.no_grad():
            got = as_tensors(folded.module()(*inputs))
    except Exception as exc:  # noqa: BLE001
        cell.update(error=f"run: {error_text(exc)}", traceback=_tb())
        return cell
    cell["ok"] = True
    cell.update(compare(got, expected, PROGRAM_TOL).to_dict())
    return cell


def lower_and_run(variant: str, program: ExportedProgram, inputs: Sequence[torch.Tensor],
                  expected: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """Lower `program` for XNNPACK under a benchmark `variant`, run the ``.pte``, compare with eager."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    from benchmarks import runner, variants

    cell: Dict[str, Any] = {"lowered": False, "runs": False, "error": None, "match": None}
    start = time.perf_counter()
    try:
        prepared = variants.prepare(variant, copy.deepcopy(program))
        et_program, stats = runner.lower(prepared.program, "xnnpack", variants.fresh_edge_passes(prepared))
        buffer = et_program.buffer
    except Exception as exc:  # noqa: BLE001
        cell.update(error=f"lower: {error_text(exc)}", traceback=_tb(), time_s=time.perf_counter() - start)
        return cell
    del et_program
    cell.update(lowered=True, pte_bytes=len(buffer), time_s=time.perf_counter() - start,
                const_only_nodes=stats.get("const_only_nodes"), edge_nodes=stats.get("nodes"))
    try:
        got = _load_for_executorch_from_buffer(buffer).forward(tuple(inputs))
    except Exception as exc:  # noqa: BLE001
        cell.update(error=f"run: {error_text(exc)}", traceback=_tb())
        return cell
    cell["runs"] = True
    cell.update(compare(got, expected, PTE_TOL).to_dict())
    return cell


def lower_qnn(name: str, program: ExportedProgram, inputs: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """HTP fp16, ``fold_constants`` on (`benchmarks.qnn_rows.lower_rows`), on the real backend:
    QNN's op validation and context compiles, and the ``.pte`` run on the emulated HTP against
    eager (``htp_max_abs_diff``, ``output_scale``)."""
    from benchmarks import qnn_rows

    with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
        (row,) = qnn_rows.lower_rows(name, program.module(), tuple(inputs), "fp16", modes=("on",))
    cell = row.to_dict()
    cell["not_decomposed_or_delegated"] = "not decomposed or delegated" in (row.status or "")
    return cell


def folding_version() -> str:
    """Git commit of the checkout and whether ``folding/`` differs from it (the code this row ran)."""
    import subprocess

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                              text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "folding"], cwd=here, capture_output=True,
                               text=True, check=False).stdout.strip()
    except OSError:
        return "?"
    return (head or "?") + (" + uncommitted folding/ changes" if dirty else "")


class _Checkpoint:
    """Writes the row to a JSON file after each step."""

    def __init__(self, row: Dict[str, Any], path: Optional[str]) -> None:
        self.row, self.path = row, path

    def step(self, name: str) -> None:
        self.row["step"] = name
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.row, f, default=str)
        os.replace(tmp, self.path)


def run_model(name: str, checkpoint: Optional[str] = None, steps: Sequence[str] = STEPS,
              builder: Callable[[str], ZooSpec] = build,
              xnnpack_variants: Sequence[str] = XNNPACK_VARIANTS) -> Dict[str, Any]:
    """The zoo's `steps` for model `name`; returns the row (also written to `checkpoint`).

    ``build`` and ``export`` always run; `xnnpack_variants` are the lowerings of the ``xnnpack``
    step (``none`` first: the folded ``.pte`` is held to run where the unfolded one runs).
    """
    row = new_row(name)
    row["steps"] = [s for s in STEPS if s in ("build", "export") or s in steps]
    row["xnnpack_variants"] = list(xnnpack_variants)
    row["folding_version"] = folding_version()
    ck = _Checkpoint(row, checkpoint)
    start = time.perf_counter()
    try:
        _run_steps(row, ck, row["steps"], builder, xnnpack_variants)
    finally:
        row["wall_time_s"] = time.perf_counter() - start
        row["done"] = True
        ck.save()
    return row


def _run_steps(row: Dict[str, Any], ck: _Checkpoint, steps: Sequence[str], builder,
               xnnpack_variants: Sequence[str]) -> None:
    ck.step("build")
    try:
        spec = builder(row["model"])
        row["family"], row["note"] = spec.family, spec.note
        with torch.no_grad():
            expected = as_tensors(spec.module(*spec.inputs))
    except Exception as exc:  # noqa: BLE001
        row["build_error"] = error_text(exc)
        row["tracebacks"]["build"] = _tb()
        return
    inputs = spec.inputs

    ck.step("export")
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            ep = torch.export.export(spec.module, inputs, strict=False)
    except Exception as exc:  # noqa: BLE001 - not ours: counted separately
        row.update(export_ok=False, export_error=error_text(exc))
        row["tracebacks"]["export"] = _tb()
        return
    del spec
    row.update(export_ok=True, export_time_s=time.perf_counter() - t0)
    stats = graph_stats.summarize(ep)
    row.update(aten_nodes=stats["nodes"], aten_const_only_nodes=stats["const_only_nodes"])
    with torch.no_grad():
        row["export_diff"] = compare(as_tensors(ep.module()(*inputs)), expected, PROGRAM_TOL).to_dict()

    if "aten" in steps:
        ck.step("aten")
        for folder in FOLDERS:
            row["aten"][folder] = fold_and_compare(folder, ep, "aten", inputs, expected)
            ck.save()

    if "edge" in steps:
        ck.step("edge")
        try:
            from executorch.exir import to_edge

            edge = to_edge(copy.deepcopy(ep)).exported_program()
            stats = graph_stats.summarize(edge)
            row.update(edge_nodes=stats["nodes"], edge_const_only_nodes=stats["const_only_nodes"])
        except Exception as exc:  # noqa: BLE001 - executorch's to_edge, before any folding
            row["edge_error"] = error_text(exc)
            row["tracebacks"]["edge"] = _tb()
            edge = None
        if edge is not None:
            for folder in FOLDERS:
                row["edge"][folder] = fold_and_compare(folder, edge, "edge", inputs, expected)
                ck.save()
            del edge

    if "xnnpack" in steps:
        ck.step("xnnpack")
        for variant in xnnpack_variants:
            row["xnnpack"][variant] = lower_and_run(variant, ep, inputs, expected)
            ck.save()

    if "qnn" in steps:
        ck.step("qnn")
        try:
            row["qnn"] = lower_qnn(row["model"], ep, inputs)
        except Exception as exc:  # noqa: BLE001 - lower_rows never raises; loading the QNN libraries may
            row["qnn"] = {"status": f"error (setup): {error_text(exc)}", "traceback": _tb()}
