"""`QnnPartitioner`: executorch's QNN partitioner with the fold stage and the HTP input rule.

Mirrors executorch/backends/qualcomm/partition/qnn_partitioner.py (subclassed, so every
``isinstance(p, executorch ... QnnPartitioner)`` check still holds) and differs in five places:

- our ``fold_constants`` compile spec is removed before executorch's code reads the list
  (`qnn.compile_spec`);
- ``transform_for_pre_decomposition`` (exir/backend/partitioner.py, called by
  ``to_edge_transform_and_lower`` on the ATen program) runs `folding.fold_constants` when the
  spec enables it;
- ``ops_to_not_decompose`` returns QNN's ``get_skip_decomp_table()`` and ``filter_fn``
  (partition/utils.py) unchanged, except that a kept-whole op the fold stage declined (still
  constant-only after folding), or one inside a control-flow body (only top-level nodes are
  partitioned), is decomposed, so it can never reach the CPU undecomposed;
- on HTP, a partition without a runtime input stays on the CPU (`qnn.htp_rule`);
- a constant that a control-flow call or the output also reads is not tagged for a partition
  (`untag_constants_read_by_the_cpu_side`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, List, Optional

import torch
from executorch.backends.qualcomm.partition.qnn_partitioner import (
    QnnOperatorSupport,
    QnnPartitioner as _ExecutorchQnnPartitioner,
)
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from executorch.backends.qualcomm.partition.utils import filter_fn, get_skip_decomp_table
from executorch.backends.qualcomm.utils.constants import QCOM_QUANT_ATTRS
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
    generate_partitions_from_list_of_nodes,
)
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.passes.infra.partitioner import Partition


from folding import FoldReport, fold_constants

from .control_flow import calls_control_flow
from .pass_manager import pass_manager_cls
from folding.ops import op_name
from folding.quant import is_dequantize, is_quantize
from folding.signature import mutated_targets
from folding.sizes import value_bytes

from .compile_spec import split_compile_specs
from .errors import EncodingLostError
from .htp_rule import is_runtime_input, partition_inputs, refuses_static_graphs
from .names import EdgeNameMap
from .provenance import origin
from .report import PartitionRecord, QnnPartitionReport, partition_report

logger = logging.getLogger(__name__)


def is_core_aten_op(target) -> bool:
    """A core ATen op (``torch.Tag.core``; for an Edge op, its ATen overload): it has no
    decomposition, so keeping it whole changes nothing but executorch's check that it was
    delegated (``_sanity_check_graph_for_non_decomp_ops``, exir/program/_program.py). HTP's op
    validation refuses some of them on runtime inputs (``scatter_add``, ``scatter_reduce``: QNN
    2.49's ``ScatterElements`` accepts only reduction NONE), and they then run on the CPU."""
    overload = getattr(target, "_op", target)
    return torch.Tag.core in getattr(overload, "tags", ())


def kept_whole_ops() -> frozenset[str]:
    """Names (``aten.linear.default``) of the ops QNN keeps whole (``get_skip_decomp_table``,
    executorch/backends/qualcomm/partition/utils.py), quantize/dequantize primitives excluded:
    those are encodings, never computations left stranded."""
    return frozenset(
        str(op) for op in get_skip_decomp_table() if not (is_quantize(op) or is_dequantize(op))
    )


class QnnPartitioner(_ExecutorchQnnPartitioner):
    """Drop-in for executorch's ``QnnPartitioner`` that understands the ``fold_constants`` spec.

    Args:
        compiler_specs: from `qnn.generate_qnn_executorch_compiler_spec` (or executorch's).
        skip_node_id_set: node names never delegated, as in the Edge program *without* folding:
            when folding removed nodes, the folded program's Edge nodes get back the names they
            have without folding (`qnn.names`), so the names mean the same nodes.
        skip_node_op_set: op names (``aten.relu.default``) never delegated.
        skip_mutable_buffer: as executorch's.
        preserve_edge_names: give the folded program's Edge nodes the names they have without
            folding. None (default): only when `skip_node_id_set` is given, where names decide
            what is delegated; True: always (debugging, comparing runs); False: never. Costs one
            extra ``to_edge`` + QNN to-edge passes of the unfolded program, about as long as
            the lowering's own ``to_edge`` (`QnnPartitionReport.naming_seconds`).
        to_edge_passes: builds QNN's to-edge passes for a program, for the name restoration;
            None: QNN's default passes (`default_to_edge_passes`).
            `qnn.to_edge_transform_and_lower_to_qnn` passes the ones it lowers with.

    Attributes:
        fold_spec: the decoded ``fold_constants`` spec, or None when folding is off.
        reports: one `QnnPartitionReport` per partitioned program, in call order.
    """

    def __init__(
        self,
        compiler_specs: List[CompileSpec],
        skip_node_id_set: Optional[set] = None,
        skip_node_op_set: Optional[set] = None,
        skip_mutable_buffer: bool = False,
        preserve_edge_names: Optional[bool] = None,
        to_edge_passes: Optional[Callable[[ExportedProgram], list]] = None,
    ) -> None:
        from .sdk import load_qnn_sdk; load_qnn_sdk()  # first QNN use: the libraries (qnn/sdk.py), or QnnSdkError
        qnn_specs, self.fold_spec = split_compile_specs(compiler_specs)
        super().__init__(qnn_specs, skip_node_id_set, skip_node_op_set, skip_mutable_buffer)
        self.preserve_edge_names = preserve_edge_names
        self.to_edge_passes = to_edge_passes or self.default_to_edge_passes
        self.reports: list[QnnPartitionReport] = []
        # Folds made before QNN's export pipeline, of programs that call control flow
        # (`qnn.control_flow.fold_control_flow_first`): that pipeline crashes on control flow.
        self.early_fold_reports: list[FoldReport] = []
        self._folds: list[_FoldRecord] = []
        self._aten_graph_id: Optional[int] = None

    @property
    def restores_names(self) -> bool:
        """Whether folded programs get their unfolded Edge names back (`preserve_edge_names`)."""
        if self.preserve_edge_names is not None:
            return bool(self.preserve_edge_names)
        return bool(self.skip_node_id_set)

    # -- fold stage ------------------------------------------------------------------------

    @property
    def fold_reports(self) -> list[FoldReport]:
        """The fold stage's reports, in the order the folds ran: the fold of a program that
        calls control flow, made before QNN's export pipeline (`early_fold_reports`), then one
        per program this partitioner's hook folded."""
        return self.early_fold_reports + [f.report for f in self._folds]

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Fold constants of the ATen program (exir/backend/partitioner.py hook).

        Folds `exported_program` **in place**: QNN's to-edge passes
        (``get_to_edge_transform_passes(ep)`` in _passes/qnn_pass_manager.py) keep the program
        object they were built from and look constants up in it by name, so the folded
        constants have to appear in that same object, or they would lose their encodings. A
        program this partitioner already folded is returned as is. This hook is the only place
        the QNN integration folds (`qnn.to_edge_transform_and_lower_to_qnn` relies on it too).
        """
        if self.fold_spec is None or any(f.program is exported_program for f in self._folds):
            self._aten_graph_id = id(exported_program.graph)
            return exported_program
        unfolded = EdgeNameMap.snapshot(exported_program, self.to_edge_passes) if self.restores_names else None
        result = fold_constants(exported_program, self.fold_spec.policy, inplace=True)
        self._record_fold(result.program, result.report, unfolded)
        return result.program

    def default_to_edge_passes(self, program: ExportedProgram) -> list:
        """QNN's default to-edge passes for this backend, bound to `program`
        (``get_to_edge_transform_passes`` in _passes/qnn_pass_manager.py), with the variants
        that leave control flow alone (`qnn.pass_manager.pass_manager_cls`)."""
        return pass_manager_cls(self.backend)().get_to_edge_transform_passes(
            program,
            compiler_specs=self.compiler_specs_snapshot,
            skip_node_id_set=set(self.skip_node_id_set),
            skip_node_op_set=set(self.skip_node_op_set),
        )

    def _record_fold(self, program: ExportedProgram, report: FoldReport, unfolded: Optional[EdgeNameMap]) -> None:
        """Record the hook's fold of `program`; the kept-whole ops still constant-only after it
        are decomposed (`ops_to_not_decompose`).

        Args:
            program: the folded ATen program about to be lowered with this partitioner.
            report: its `FoldReport`.
            unfolded: `EdgeNameMap.snapshot` of the program before folding, to give the folded
                program's Edge nodes their unfolded names; None keeps ``to_edge``'s names.
        """
        table = kept_whole_ops()
        declined = {d.node: d for d in report.kept_constant_only if d.target in table}
        for d in declined.values():
            logger.info(
                "decomposing %s (%s): constant-only after folding (%s: %s)",
                d.node, d.target, d.reason.name, d.detail,
            )
        self._folds.append(
            _FoldRecord(program, id(program.graph), report, declined, _encoded_constants(program, report), unfolded)
        )

    # -- decomposition ---------------------------------------------------------------------

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Optional[Callable[[torch.fx.Node], bool]]]:
        """QNN's ``get_skip_decomp_table()`` and ``filter_fn``, minus the kept-whole nodes the
        fold stage declined (they are decomposed, and the report lists them) and the nodes
        inside control-flow bodies: `partition` tags top-level nodes only, so a body's
        kept-whole op would be neither delegated nor decomposed (executorch's
        ``_replace_aten_ops_with_transformed_ops`` asks this filter about body nodes too)."""
        table = get_skip_decomp_table()
        decompose = self._declined_nodes(ep)
        top = ep.graph

        def keep_whole(node: torch.fx.Node) -> bool:
            return (node.graph is top and node not in decompose and filter_fn(node)
                    and not is_core_aten_op(node.target))

        return table, keep_whole

    def _declined_nodes(self, ep: ExportedProgram) -> set[torch.fx.Node]:
        """Nodes of `ep` (the functionalized ATen program, or later the Edge program) that come
        from a kept-whole node the fold stage declined, found by provenance (run_decompositions
        renames nodes) and still constant-only."""
        declined = [(f.graph_id, set(f.declined)) for f in self._folds if f.declined]
        if not declined:
            return set()
        table = kept_whole_ops()
        candidates = [n for n in ep.graph.nodes if n.op == "call_function" and op_name(n.target) in table]
        if not candidates:
            return set()
        constant = _constant_only(ep)
        return {
            n for n in candidates
            if n in constant and any(origin(n, graph_id) in names for graph_id, names in declined)
        }

    # -- partitioning ----------------------------------------------------------------------

    def partition(self, edge_program: ExportedProgram) -> PartitionResult:
        """executorch's ``QnnPartitioner.partition`` (partition/qnn_partitioner.py: generate
        partitions, tag nodes, constant data and mutated buffers), with the partitions HTP
        refuses left untagged (`screen_partitions`). On a folded program the unfolded Edge
        names are restored first (when `restores_names`) and kept encodings are checked; a
        `QnnPartitionReport` is appended to `reports` (`qnn.report.partition_report`).

        Raises:
            EncodingLostError: a folded constant that fed a kept dequantize lost its encoding.
        """
        fold = self._fold_for(edge_program)
        renamed, naming_seconds = self._restore_names(edge_program, fold)
        if fold is not None:
            _check_encodings(edge_program, fold.encoded)
        declined: dict[str, str] = {}
        kept, partitions = screen_partitions(
            edge_program, self._candidate_partitions(edge_program, declined), refuses_static_graphs(self.backend)
        )
        self.tag_nodes(kept, edge_program)
        tag_constant_data(edge_program)
        untag_constants_read_by_the_cpu_side(edge_program)
        if not self.skip_mutable_buffer:
            tag_mutated_buffer(edge_program)
        graph_id = fold.graph_id if fold is not None else self._aten_graph_id
        self.reports.append(partition_report(
            edge_program, self.backend.name, fold.report if fold else None,
            list(fold.declined.values()) if fold else [], graph_id, renamed, naming_seconds, declined, partitions,
        ))
        if fold is not None and fold.report.folded:
            gone = sorted(set(self.skip_node_id_set) - set(self.reports[-1].nodes))
            if gone:
                logger.info("skip_node_id_set names nodes absent after folding: %s", gone)
        return PartitionResult(tagged_exported_program=edge_program, partition_tags=self.partition_tags)

    def generate_partitions(self, edge_program: ExportedProgram) -> List[Partition]:
        """executorch's hook, for callers that use it directly: the partitions QNN supports,
        minus those HTP refuses."""
        kept, _ = screen_partitions(
            edge_program, self._candidate_partitions(edge_program), refuses_static_graphs(self.backend)
        )
        return kept

    def _candidate_partitions(self, edge_program: ExportedProgram, declined: Optional[dict] = None) -> List[Partition]:
        """executorch's ``generate_partitions``, with the support check of `_OperatorSupport`
        (which records in `declined` why each node it declines stays on the CPU)."""
        support = _OperatorSupport(edge_program, self.compiler_specs_snapshot, self.skip_node_id_set,
                                   self.skip_node_op_set, declined=declined)
        return generate_partitions_from_list_of_nodes(edge_program.graph_module, op_support=support)

    def _restore_names(self, edge_program: ExportedProgram, fold: Optional["_FoldRecord"]) -> tuple[dict, float]:
        """Give a folded program's Edge nodes their unfolded names (`qnn.names`); returns
        ({old: new}, seconds spent), or ({}, 0.0) when names are not restored."""
        if fold is None or fold.unfolded is None or not fold.report.folded:
            return {}, 0.0
        start = time.perf_counter()
        renamed = fold.unfolded.restore(edge_program, fold.graph_id)
        return renamed, time.perf_counter() - start

    # -- helpers ---------------------------------------------------------------------------

    def _fold_for(self, edge_program: ExportedProgram) -> Optional["_FoldRecord"]:
        """The fold record of the program `edge_program` was lowered from (matched by its
        lifted placeholders; the most recent fold when several match)."""
        if not self._folds:
            return None
        placeholders = {n.name for n in edge_program.graph.nodes if n.op == "placeholder"}
        for fold in reversed(self._folds):
            lifted = {c.placeholder for c in fold.report.lifted}
            if lifted <= placeholders:
                return fold
        return self._folds[-1]


class _OperatorSupport(QnnOperatorSupport):
    """QNN's operator-support check (partition/qnn_partitioner.py), except that a node reading
    or producing a tensor with a data-dependent (unbacked) size is unsupported: QNN's node
    visitors build tensors from concrete sizes, and ``NodeVisitor.define_tensor``
    (builders/node_visitor.py) raises ``TypeError`` on such a node (``k[mask].sum()``) instead
    of declining it."""

    def __init__(self, *args, declined: Optional[dict] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.declined = {} if declined is None else declined

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op == "call_function" and _has_unbacked_size(node):
            logger.info("%s | data-dependent size, stays on the CPU", node.name)
            self.declined[node.name] = "data-dependent size (QNN's node visitors need concrete sizes)"
            return False
        supported = super().is_node_supported(submodules, node)
        if not supported and node.op == "call_function":
            self.declined[node.name] = self._why_declined(node)
        return supported

    def _why_declined(self, node: torch.fx.Node) -> str:
        """Which of ``QnnOperatorSupport.is_node_supported``'s checks declined `node`, in its order."""
        from executorch.backends.qualcomm.partition.common_defs import (
            not_supported_operator,
            to_be_implemented_operator,
        )
        from executorch.backends.qualcomm.utils.constants import QCOM_FALLBACK_NODE

        if node.target in not_supported_operator:
            return "not supported by QNN (executorch's not_supported_operator)"
        if node.target in to_be_implemented_operator:
            return "not implemented in executorch's QNN backend (to_be_implemented_operator)"
        if node.meta.get(QCOM_FALLBACK_NODE, False):
            return "forced CPU fallback"
        if node.name in self.skip_node_id_set or node.target.__name__ in self.skip_node_op_set:
            return "skip_node_id_set / skip_node_op_set"
        if node.target.__name__ not in self.node_visitors:
            return "no QNN node visitor (builders/)"
        return "refused by QNN's op validation (QnnBackend_validateOpConfig)"


def untag_constants_read_by_the_cpu_side(edge_program: ExportedProgram) -> list[str]:
    """Untag each parameter, buffer or lifted constant that `tag_constant_data` gave a
    partition's tag although a control-flow call or the output also reads it: executorch
    1.5.1's ``tag_constant_data`` (exir/backend/utils.py) tags a constant after its tagged
    readers only, and ``to_backend`` then refuses the program (exir/backend/backend_api.py:
    "constant data node (p_w) is tagged with (qnn_0) but has user (map_impl) which has tag
    (None)"). Untagged, the constant stays in the program, stored once, and the delegate reads
    it as an input. Only readers that no partition can hold count (a partitioner may not
    add placeholders, so the constant cannot be given to each side): a partition reading a
    constant that an op left on the CPU also reads keeps QNN's tag, since some QNN op builders
    require static operands (``rms_norm``'s weight). Returns the untagged placeholders' names."""
    out = []
    for node in edge_program.graph.find_nodes(op="placeholder"):
        tag = node.meta.get("delegation_tag")
        if tag is not None and any(u.op == "output" or calls_control_flow(u) for u in node.users):
            del node.meta["delegation_tag"]
            out.append(node.name)
    return out


def screen_partitions(
    edge_program: ExportedProgram, partitions: List[Partition], refuses_static: bool
) -> tuple[List[Partition], list[PartitionRecord]]:
    """Split QNN's candidate partitions into those delegated and those HTP refuses.

    Args:
        edge_program: the Edge program the partitions are of.
        partitions: candidate partitions (every node QNN supports, grouped).
        refuses_static: the backend refuses a graph without a runtime input (HTP,
            `qnn.htp_rule.refuses_static_graphs`).

    Returns:
        (partitions to delegate, one `PartitionRecord` per candidate in the given order: its
        nodes, runtime and static inputs, static input bytes (unpadded), and why it stays on
        the CPU when it does). Pure: neither the program nor the partitions are changed.
    """
    kept: List[Partition] = []
    records: list[PartitionRecord] = []
    for partition in partitions:
        nodes = [n for n in edge_program.graph.nodes if n in partition.nodes]
        inputs = partition_inputs(nodes)
        runtime = [i for i in inputs if is_runtime_input(i, edge_program)]
        static = [i for i in inputs if i not in runtime]
        refused = refuses_static and not runtime
        if refused:
            logger.info(
                "partition %s (%s) stays on the CPU: HTP refuses a graph without a runtime input",
                partition.id, ", ".join(n.name for n in nodes),
            )
        else:
            kept.append(partition)
        records.append(
            PartitionRecord(
                tag=None if refused else f"qnn_{partition.id}",
                nodes=tuple(n.name for n in nodes),
                runtime_inputs=tuple(i.name for i in runtime),
                static_inputs=tuple(i.name for i in static),
                static_input_bytes=sum(value_bytes(i) for i in static),
                reason="HTP refuses a graph without a runtime input" if refused else "",
            )
        )
    return kept, records


def _has_unbacked_size(node: torch.fx.Node) -> bool:
    for n in (node, *node.all_input_nodes):
        val = n.meta.get("val")
        if val is not None and free_unbacked_symbols(val):
            return True
    return False


class _FoldRecord:
    __slots__ = ("program", "graph_id", "report", "declined", "encoded", "unfolded")

    def __init__(self, program, graph_id, report, declined, encoded, unfolded) -> None:
        self.program = program
        self.graph_id = graph_id
        self.report = report
        self.declined = declined
        self.encoded = encoded
        self.unfolded = unfolded


def _encoded_constants(program: ExportedProgram, report: FoldReport) -> frozenset[str]:
    """Lifted constants whose readers include a dequantize: QNN must read their encoding."""
    lifted = {c.placeholder for c in report.lifted}
    return frozenset(
        n.name for n in program.graph.nodes
        if n.op == "placeholder" and n.name in lifted and any(is_dequantize(u.target) for u in n.users)
    )


def _check_encodings(edge_program: ExportedProgram, encoded: Iterable[str]) -> None:
    """Raise `EncodingLostError` when a folded integer constant read through a dequantize
    reaches the partitioner without QNN's ``quant_attrs`` (AnnotateQuantAttrs did not see it)."""
    present = {n.name: n for n in edge_program.graph.nodes if n.op == "placeholder"}
    lost = sorted(name for name in encoded if name in present and QCOM_QUANT_ATTRS not in present[name].meta)
    if lost:
        raise EncodingLostError(
            f"folded constants {lost} have no QNN encoding (quant_attrs): QNN's to-edge passes were "
            "built from a program object other than the folded one, so FoldQDQ removed their "
            "dequantize. Build the passes from the folded program "
            "(get_to_edge_transform_passes(folded_ep)), or let QnnPartitioner fold the program "
            "object the passes were built from (to_edge_transform_and_lower(ep, transform_passes, "
            "partitioner=[qnn.QnnPartitioner(specs)]) folds `ep` in place)."
        )


def _constant_only(ep: ExportedProgram) -> set[torch.fx.Node]:
    """Nodes of `ep`'s top graph computed from parameters, non-mutated buffers and lifted
    constants only (one pass over the graph)."""
    sig = ep.graph_signature
    mutated = mutated_targets(sig)
    stored = {
        s.arg.name
        for s in sig.input_specs
        if s.kind in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR)
        or (s.kind == InputKind.BUFFER and s.target not in mutated)
    }
    constant: set[torch.fx.Node] = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if n.name in stored:
                constant.add(n)
        elif n.op in ("call_function", "get_attr") and all(i in constant for i in n.all_input_nodes):
            constant.add(n)
    return constant


__all__ = ["QnnPartitioner", "kept_whole_ops", "screen_partitions"]
