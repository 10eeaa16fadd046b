"""`fold_constants`: the constant-propagation stage (analysis → plan → evaluate → lift → report)."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram

from .analysis import analyze
from .errors import InvalidProgramError
from .evaluate import AliasClassFailed, UndeclaredWrite, evaluate
from .lift import lift
from .ops import op_name
from .plan import make_plan
from .quant import describe_encoding
from .policy import FoldPolicy
from .report import Decision, FoldReport, Reason
from .sizes import nbytes, stored_constant_bytes, stored_tensor, tensor_key

logger = logging.getLogger(__name__)


@dataclass
class FoldResult:
    """Attributes:
    program: the folded ExportedProgram (the input object itself only when ``inplace=True``).
    report: what was folded and kept, and why.
    """

    program: ExportedProgram
    report: FoldReport


def fold_constants(
    program: ExportedProgram, policy: FoldPolicy | None = None, *, inplace: bool = False
) -> FoldResult:
    """Fold every constant-only subgraph of `program` into lifted constants.

    Works on ATen-dialect programs (including torch 2.14's training IR with in-place ops) and
    Edge-dialect programs. A folded value that a kept op or the output reads becomes a
    placeholder with a ``CONSTANT_TENSOR`` InputSpec whose tensor (contiguous, detached, owning
    its storage) is in ``program.constants``; identical tensors (dtype, shape, bytes) are stored
    once. Nodes that are not folded keep their names. Parameters, buffers and constants left
    without users are removed.

    Args:
        program: an ``ExportedProgram`` from ``torch.export.export``, ``to_edge`` or a pass.
        policy: limits and switches; ``FoldPolicy()`` when None.
        inplace: rewrite `program` itself. When False the caller's program (graph, signature,
            dicts, tensors) is left unchanged; unchanged tensors are shared, not copied.

    Returns:
        `FoldResult` with the folded program and its `FoldReport`.

    Raises:
        InvalidProgramError: `program` is not an ExportedProgram, or its signature does not
            match its placeholders.
    """
    if not isinstance(program, ExportedProgram):
        raise InvalidProgramError(f"fold_constants expects a torch.export.ExportedProgram, got {type(program).__name__}")
    with _no_cyclic_gc():
        return _fold(program, policy or FoldPolicy(), inplace)


@contextlib.contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector while folding. The fold allocates hundreds of
    thousands of small, acyclic objects (fx nodes, argument tuples); every generation-0 pass
    walks them, which cost ~30% of the time at 50,000 nodes (`python -m benchmarks.scale`).
    Tensors are freed by reference counting as before; cycles are collected afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _fold(program: ExportedProgram, policy: FoldPolicy, inplace: bool) -> FoldResult:
    timings: dict[str, float] = {}
    start = time.perf_counter()
    bytes_before = stored_constant_bytes(program)
    _check_signature(program)

    gm = program.graph_module  # read only: `lift` builds the new graph
    state_dict, constants = program.state_dict, program.constants

    placeholder_bytes = _placeholder_bytes(gm.graph, program)
    forced: dict = {}
    extra_writes: dict = {}
    while True:
        t0 = time.perf_counter()
        analysis = analyze(gm.graph, program.graph_signature, policy, forced, extra_writes)
        plan = make_plan(analysis, policy, placeholder_bytes, bytes_before)
        t1 = time.perf_counter()
        try:
            evaluation = evaluate(
                plan,
                analysis,
                lambda n: stored_tensor(analysis.specs[n.name], state_dict, constants),
                lambda target: _get_attr(gm, target),
            )
        except AliasClassFailed as failure:
            # An in-place class can only fold whole: keep it and rerun (rare: each rerun keeps
            # one more class, so at most one rerun per failing class).
            logger.info("keeping in-place alias class of %s: %s", failure.root.name, failure.detail)
            for n, root in analysis.alias_root.items():
                if root is failure.root:
                    forced[n] = (failure.reason, failure.detail)
            forced[failure.root] = (failure.reason, failure.detail)
            continue
        except UndeclaredWrite as write:
            # The op updates that input in place: rerun with the write known, so the input's
            # class (or buffer) is no longer constant after it. Each rerun adds one write.
            logger.info("%s", write)
            extra_writes.setdefault(write.node, set()).add(write.written)
            continue
        t2 = time.perf_counter()
        break
    timings["analysis"] = t1 - t0
    timings["evaluation"] = t2 - t1

    folded = {n for n in plan.candidates if plan.folded(n) and n not in evaluation.kept}
    considered = [n for n in gm.graph.nodes if n.op == "call_function"]
    constant_placeholders = {n for n in gm.graph.nodes if n.op == "placeholder" and analysis.is_constant(n)}
    new_program, lifting = lift(
        program, folded, evaluation.values, constant_placeholders, inplace=inplace, bound=evaluation.symbols
    )
    decisions = _decisions(considered, analysis, plan, evaluation, lambda name: lifting.lifted_as.get(name, name))
    timings["lift"] = time.perf_counter() - t2
    timings["total"] = time.perf_counter() - start

    decisions = [
        Decision(d.node, d.target, d.reason, d.detail, lifting.lifted_as.get(d.node)) for d in decisions
    ]
    report = FoldReport(
        decisions=decisions,
        lifted=lifting.lifted,
        removed_placeholders=lifting.removed,
        constant_bytes_before=bytes_before,
        constant_bytes_after=stored_constant_bytes(new_program),
        timings=timings,
        peak_intermediate_bytes=evaluation.peak_intermediate_bytes,
        evaluated_nodes=evaluation.evaluated,
    )
    logger.info(
        "folded %d nodes into %d lifted constants; constant bytes %d -> %d",
        len(report.folded), len(report.lifted), report.constant_bytes_before, report.constant_bytes_after,
    )
    return FoldResult(new_program, report)


def _decisions(nodes, analysis, plan, evaluation, rename) -> list[Decision]:
    out = []
    for n in nodes:
        reason = analysis.reason[n]
        detail = analysis.detail.get(n, "")
        if n in evaluation.kept:
            reason, detail = evaluation.kept[n]
        elif n in plan.runtime:
            reason, detail = plan.runtime[n]
            if reason is Reason.KEEPS_ENCODING:
                detail = describe_encoding(n, rename)
        elif reason is None:
            reason = Reason.CHECKED if analysis.is_check(n) else Reason.FOLDED
        out.append(Decision(n.name, op_name(n.target), reason, detail))
    return out


def _placeholder_bytes(graph: torch.fx.Graph, program: ExportedProgram) -> dict[torch.fx.Node, int]:
    """Stored bytes per constant placeholder; a tensor shared by several placeholders (tied
    weights) counts for the first only, as in `stored_constant_bytes`."""
    specs = {s.arg.name: s for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}
    seen: set = set()
    out: dict[torch.fx.Node, int] = {}
    for n in graph.nodes:
        if n.op != "placeholder" or n.name not in specs:
            continue
        t = stored_tensor(specs[n.name], program.state_dict, program.constants)
        if t is None:
            continue
        key = tensor_key(t)
        out[n] = 0 if key in seen else nbytes(t)
        seen.add(key)
    return out


def _get_attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _check_signature(program: ExportedProgram) -> None:
    placeholders = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    spec_names = [getattr(s.arg, "name", None) for s in program.graph_signature.input_specs]
    if placeholders != spec_names:
        mismatch = next(
            (f"placeholder {p!r} vs InputSpec {s!r}" for p, s in zip(placeholders, spec_names) if p != s),
            f"{len(placeholders)} placeholders vs {len(spec_names)} InputSpecs",
        )
        raise InvalidProgramError(f"graph signature does not match the graph's placeholders: {mismatch}")
