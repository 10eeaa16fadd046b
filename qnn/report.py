"""What `qnn.QnnPartitioner` decided: partitions kept or refused, nodes decomposed on purpose."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from folding import Decision, FoldReport


@dataclass(frozen=True)
class PartitionRecord:
    """One partition found by QNN's operator-support check.

    Attributes:
        tag: the delegation tag (``qnn_<id>``) it was lowered under; None when kept on the CPU.
        nodes: names of its nodes, in graph order.
        runtime_inputs: its inputs written at run time (user inputs, mutated buffers, values
            computed outside it), see `qnn.htp_rule`.
        static_inputs: its inputs that are parameters, buffers or lifted constants.
        static_input_bytes: bytes of the static inputs it reads.
        reason: why it was kept on the CPU, or "" when delegated.
    """

    tag: Optional[str]
    nodes: tuple[str, ...]
    runtime_inputs: tuple[str, ...]
    static_inputs: tuple[str, ...]
    static_input_bytes: int
    reason: str = ""

    @property
    def delegated(self) -> bool:
        return self.tag is not None


@dataclass
class QnnPartitionReport:
    """The partitioner's decisions for one edge program.

    Attributes:
        backend: QNN backend type name (``kHtpBackend`` ...).
        partitions: every partition QNN's operator-support check found, delegated or refused.
        decomposed: kept-whole ops (``get_skip_decomp_table``) that were still constant-only
            after folding (the fold stage declined them, see each decision's reason) and were
            therefore decomposed, so they cannot reach the CPU undecomposed.
        fold_report: the fold stage's report, when folding ran for this program.
        quant_attrs: ``QCOM_QUANT_ATTRS`` (`qnn.executorch_internals.QUANT_ATTRS`) per node
            name, as QNN's to-edge passes left them on the program the partitioner saw (the
            encodings QNN reads).
        nodes: name -> (op name, input names) of every call_function node the partitioner saw.
        renamed: {name given by ``to_edge``: unfolded name} of the nodes given back the name
            they have without folding (`qnn.names`).
        origins: Edge node name -> name of the ATen node it comes from (``meta["from_node"]``),
            when the partitioner saw the ATen program (its pre-decomposition hook ran).
        naming_seconds: wall time spent giving back the unfolded names, in seconds: lowering
            a copy of the *unfolded* program with the same to-edge passes (`qnn.names`,
            ``EdgeNameMap.unfolded_names``) and renaming the folded program's Edge nodes; the
            copy made before folding is not counted. 0 when names were not restored.
        declined_by_qnn: node name -> why QNN's operator-support check declined it (no node
            visitor, QNN's op validation, skip sets, data-dependent size, ...).
    """

    backend: str
    partitions: list[PartitionRecord] = field(default_factory=list)
    decomposed: list[Decision] = field(default_factory=list)
    fold_report: Optional[FoldReport] = None
    quant_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    naming_seconds: float = 0.0
    declined_by_qnn: dict[str, str] = field(default_factory=dict)

    @property
    def delegated(self) -> list[PartitionRecord]:
        return [p for p in self.partitions if p.delegated]

    @property
    def refused(self) -> list[PartitionRecord]:
        return [p for p in self.partitions if not p.delegated]


def partition_report(edge_program, backend: str, fold_report: Optional[FoldReport], decomposed: list,
                     graph_id: Optional[int], renamed: dict, naming_seconds: float, declined: dict,
                     partitions: list) -> QnnPartitionReport:
    """The `QnnPartitionReport` of one partitioned Edge program, from what the partitioner
    recorded: the fold's report and the kept-whole ops it decomposed, the ATen graph the nodes
    come from (`graph_id`: provenance, `qnn.provenance.origin`), the names restored, why QNN
    declined nodes, and the partitions screened (`qnn.partitioner.screen_partitions`). Reads
    `edge_program` only."""
    from folding.core.ops import op_name

    from .executorch_internals import has_quant_attrs, quant_attrs as encoding_of
    from .provenance import origin

    calls = [n for n in edge_program.graph.nodes if n.op == "call_function"]
    report = QnnPartitionReport(
        backend=backend, partitions=partitions, decomposed=decomposed, fold_report=fold_report,
        quant_attrs={n.name: dict(encoding_of(n)) for n in edge_program.graph.nodes
                     if has_quant_attrs(n)},
        nodes={n.name: (op_name(n.target), tuple(i.name for i in n.all_input_nodes)) for n in calls},
        renamed=renamed, naming_seconds=naming_seconds, declined_by_qnn=declined,
    )
    if graph_id is not None:
        report.origins = {n.name: src for n in calls if (src := origin(n, graph_id)) is not None}
    return report
