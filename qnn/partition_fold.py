"""The fold stage's bookkeeping for `qnn.QnnPartitioner`: one `FoldRecord` per program its
pre-decomposition hook folded, and the steps of ``partition`` that read it.

executorch's ``QnnPartitioner`` (executorch/backends/qualcomm/partition/qnn_partitioner.py) has
no fold stage; these functions are the partitioner's additions around executorch's own steps:

- `record_fold`: what ``ops_to_not_decompose`` and ``partition`` need from a fold (the
  kept-whole ops it declined, the folded constants that must keep a QNN encoding, the unfolded
  Edge names);
- `fold_for`: which fold an Edge program comes from;
- `restore_names`: give the folded program's Edge nodes their unfolded names (`qnn.names`);
- `check_encodings`: folded constants read through a dequantize still carry QNN's encoding;
- `declined_nodes`: the nodes ``ops_to_not_decompose`` lets decompose;
- `fold_partition_report`: the `qnn.QnnPartitionReport` of one partitioned program (pure).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch.export import ExportedProgram

from folding import Decision, FoldReport
from folding.core.ops import op_name
from folding.core.quant import is_dequantize
from folding.core.unchanging import unchanging_before_probes

from .errors import EncodingLostError
from .executorch_internals import has_quant_attrs
from .names import EdgeNameMap
from .provenance import origin
from .report import PartitionRecord, QnnPartitionReport, partition_report

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class FoldRecord:
    """One fold made by the partitioner's pre-decomposition hook.

    Attributes:
        program: the folded ATen program (folded in place: the object the caller lowers).
        graph_id: ``id(program.graph)``, the provenance key of its nodes (`qnn.provenance`).
        report: the fold's `FoldReport`.
        declined: ATen node name -> the fold stage's decision, for the kept-whole ops
            (`qnn.kept_whole_ops`) still constant-only after folding.
        encoded: lifted constants read through a dequantize: QNN must read their encoding.
        unfolded: `EdgeNameMap.snapshot` of the program before folding, or None when the
            Edge names are not restored.
    """

    program: ExportedProgram
    graph_id: int
    report: FoldReport
    declined: dict[str, Decision]
    encoded: frozenset[str]
    unfolded: Optional[EdgeNameMap]


def record_fold(program: ExportedProgram, report: FoldReport, unfolded: Optional[EdgeNameMap],
                kept_whole: frozenset[str]) -> FoldRecord:
    """The `FoldRecord` of the hook's fold of `program` (`kept_whole`: `qnn.kept_whole_ops`);
    logs each kept-whole op it declined, which ``ops_to_not_decompose`` then decomposes."""
    declined = {d.node: d for d in report.kept_constant_only if d.target in kept_whole}
    for d in declined.values():
        logger.info(
            "decomposing %s (%s): constant-only after folding (%s: %s)",
            d.node, d.target, d.reason.name, d.detail,
        )
    return FoldRecord(program, id(program.graph), report, declined, encoded_constants(program, report), unfolded)


def fold_for(folds: list[FoldRecord], edge_program: ExportedProgram) -> Optional[FoldRecord]:
    """The record of the fold `edge_program` was lowered from (matched by its lifted
    placeholders; the most recent fold when several match, or when none does)."""
    if not folds:
        return None
    placeholders = {n.name for n in edge_program.graph.nodes if n.op == "placeholder"}
    for fold in reversed(folds):
        if {c.placeholder for c in fold.report.lifted} <= placeholders:
            return fold
    return folds[-1]


def restore_names(edge_program: ExportedProgram, fold: Optional[FoldRecord]) -> tuple[dict[str, str], float]:
    """Give a folded program's Edge nodes their unfolded names (`qnn.names`); returns
    ({old: new}, seconds spent), or ({}, 0.0) when names are not restored."""
    if fold is None or fold.unfolded is None or not fold.report.folded:
        return {}, 0.0
    start = time.perf_counter()
    renamed = fold.unfolded.restore(edge_program, fold.graph_id)
    return renamed, time.perf_counter() - start


def check_encodings(edge_program: ExportedProgram, fold: Optional[FoldRecord]) -> None:
    """Raise `EncodingLostError` when a folded integer constant read through a dequantize
    reaches the partitioner without QNN's ``quant_attrs`` (AnnotateQuantAttrs did not see it)."""
    if fold is None:
        return
    present = {n.name: n for n in edge_program.graph.nodes if n.op == "placeholder"}
    lost = sorted(name for name in fold.encoded if name in present and not has_quant_attrs(present[name]))
    if lost:
        raise EncodingLostError(
            f"folded constants {lost} have no QNN encoding (quant_attrs): QNN's to-edge passes were "
            "built from a program object other than the folded one, so FoldQDQ removed their "
            "dequantize. Build the passes from the folded program "
            "(get_to_edge_transform_passes(folded_ep)), or let QnnPartitioner fold the program "
            "object the passes were built from (to_edge_transform_and_lower(ep, transform_passes, "
            "partitioner=[qnn.QnnPartitioner(specs)]) folds `ep` in place)."
        )


def declined_nodes(folds: Iterable[FoldRecord], ep: ExportedProgram, kept_whole: frozenset[str]) -> set[torch.fx.Node]:
    """Nodes of `ep` (the functionalized ATen program, or later the Edge program) that come
    from a kept-whole node the fold stage declined, found by provenance (run_decompositions
    renames nodes) and still constant-only."""
    declined = [(f.graph_id, set(f.declined)) for f in folds if f.declined]
    if not declined:
        return set()
    candidates = [n for n in ep.graph.nodes if n.op == "call_function" and op_name(n.target) in kept_whole]
    if not candidates:
        return set()
    constant = constant_only(ep)
    return {
        n for n in candidates
        if n in constant and any(origin(n, graph_id) in names for graph_id, names in declined)
    }


def fold_partition_report(edge_program: ExportedProgram, backend: str, fold: Optional[FoldRecord],
                          aten_graph_id: Optional[int], renamed: dict[str, str], naming_seconds: float,
                          declined_by_qnn: dict[str, str], partitions: list[PartitionRecord]) -> QnnPartitionReport:
    """The `QnnPartitionReport` of one partitioned Edge program (`qnn.report.partition_report`),
    with what `fold` recorded when the program was folded; the nodes' provenance is that of the
    folded ATen program, else of the ATen program the hook saw unfolded (`aten_graph_id`).
    Pure: reads `edge_program` only."""
    return partition_report(
        edge_program, backend, fold.report if fold else None, list(fold.declined.values()) if fold else [],
        fold.graph_id if fold is not None else aten_graph_id, renamed, naming_seconds, declined_by_qnn, partitions,
    )


def log_skipped_names_gone(skip_node_id_set: Iterable[str], fold: Optional[FoldRecord],
                           report: QnnPartitionReport) -> None:
    """Log the names of `skip_node_id_set` that name no node of a program folding changed."""
    if fold is not None and fold.report.folded:
        gone = sorted(set(skip_node_id_set) - set(report.nodes))
        if gone:
            logger.info("skip_node_id_set names nodes absent after folding: %s", gone)


def encoded_constants(program: ExportedProgram, report: FoldReport) -> frozenset[str]:
    """Lifted constants whose readers include a dequantize: QNN must read their encoding."""
    lifted = {c.placeholder for c in report.lifted}
    return frozenset(
        n.name for n in program.graph.nodes
        if n.op == "placeholder" and n.name in lifted and any(is_dequantize(u.target) for u in n.users)
    )


def constant_only(ep: ExportedProgram) -> set[torch.fx.Node]:
    """Nodes of `ep`'s top graph computed only from parameters, buffers and lifted constants
    whose value is the same at every call (`folding.core.unchanging.unchanging_before_probes`: not
    written back by the signature nor in place by an op of the graph; two passes over the
    graph)."""
    stored = unchanging_before_probes(ep)
    constant: set[torch.fx.Node] = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if n.name in stored:
                constant.add(n)
        elif n.op in ("call_function", "get_attr") and all(i in constant for i in n.all_input_nodes):
            constant.add(n)
    return constant
