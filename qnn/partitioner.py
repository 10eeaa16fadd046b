"""`QnnPartitioner`: executorch's QNN partitioner with the fold stage and the HTP input rule.

Mirrors executorch/backends/qualcomm/partition/qnn_partitioner.py (subclassed, so every
``isinstance(p, executorch ... QnnPartitioner)`` check still holds). What it does differently:

- constructing one loads the QNN libraries (`qnn.sdk.load_qnn_sdk`) or raises `QnnSdkError`;
  it takes two more keyword arguments, ``preserve_edge_names`` and ``to_edge_passes``;
- our ``fold_constants`` compile spec is removed before executorch's code reads the list
  (`qnn.compile_spec`);
- ``transform_for_pre_decomposition`` (exir/backend/partitioner.py, called by
  ``to_edge_transform_and_lower`` on the ATen program) runs `folding.fold_constants` when the
  spec enables it;
- ``ops_to_not_decompose`` returns QNN's ``get_skip_decomp_table()`` and ``filter_fn``
  (partition/utils.py) unchanged, except that a kept-whole op the fold stage declined (still
  constant-only after folding), or one inside a control-flow body (only top-level nodes are
  partitioned), is decomposed, so it can never reach the CPU undecomposed; a core ATen op
  (`is_core_aten_op`, nothing to decompose) is not kept whole;
- ``partition`` gives a folded program its unfolded Edge names back (when
  ``preserve_edge_names``, or by default when ``skip_node_id_set`` names nodes) and checks that
  every folded constant feeding a kept dequantize has its encoding (`EncodingLostError`);
- a node reading or producing a tensor of data-dependent size is declined (executorch's node
  visitors raise ``TypeError`` on it), and every declined node gets a reason;
- on HTP, a partition without a runtime input stays on the CPU (`qnn.htp_rule`);
- a constant that a control-flow call or the output also reads is not tagged for a partition
  (`untag_constants_read_by_the_cpu_side`);
- each partitioned program appends a `QnnPartitionReport` to ``reports`` (and the folds'
  reports to ``fold_reports``).

``QnnPartitioner.partition`` composes executorch's steps (``generate_partitions``' support
check and grouping, ``tag_nodes``, ``tag_constant_data``, ``tag_mutated_buffer``) with ours, each
one named function: `screen_partitions`, `untag_constants_read_by_the_cpu_side`, and the fold
bookkeeping of `qnn.partition_fold` (which fold a program comes from, its unfolded names, its
encodings, the `QnnPartitionReport`).

The executorch classes subclassed here, the methods overridden or called and the attributes
read (``generate_partitions``, ``tag_nodes``, ``compiler_specs_snapshot``, ``node_visitors``
...), the ``delegation_tag`` and ``fallback_node`` meta keys and ``EdgeOpOverload._op`` are
named in `qnn.executorch_internals`, each pinned by tests/qnn/test_executorch_internals.py.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional

import torch
from executorch.backends.qualcomm.partition.utils import get_skip_decomp_table
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
    generate_partitions_from_list_of_nodes,
)
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.passes.infra.partitioner import Partition

from folding import FoldReport, fold_constants
from folding.core.quant import is_dequantize, is_quantize
from folding.core.sizes import value_bytes

from . import executorch_internals as ei
from .compile_spec import split_compile_specs
from .control_flow import calls_control_flow
from .htp_rule import is_runtime_input, partition_inputs, refuses_static_graphs
from .names import EdgeNameMap, PassFactory
from .partition_fold import (FoldRecord, check_encodings, declined_nodes, fold_for, fold_partition_report,
                             log_skipped_names_gone, record_fold, restore_names)
from .pass_manager import pass_manager_cls
from .report import PartitionRecord, QnnPartitionReport

logger = logging.getLogger(__name__)


def is_core_aten_op(target) -> bool:
    """A core ATen op (``torch.Tag.core``; for an Edge op, its ATen overload): it has no
    decomposition, so keeping it whole changes nothing but executorch's check that it was
    delegated (``_sanity_check_graph_for_non_decomp_ops``, exir/program/_program.py). HTP's op
    validation refuses some of them on runtime inputs (``scatter_add``, ``scatter_reduce``: QNN
    2.49's ``ScatterElements`` accepts only reduction NONE), and they then run on the CPU."""
    overload = ei.aten_overload(target)
    return torch.Tag.core in getattr(overload, "tags", ())


def kept_whole_ops() -> frozenset[str]:
    """Names (``aten.linear.default``) of the ops QNN keeps whole (``get_skip_decomp_table``,
    executorch/backends/qualcomm/partition/utils.py), quantize/dequantize primitives excluded:
    those are encodings, never computations left stranded."""
    return frozenset(
        str(op) for op in get_skip_decomp_table() if not (is_quantize(op) or is_dequantize(op))
    )


class QnnPartitioner(ei.ExecutorchQnnPartitioner):
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
        to_edge_passes: builds QNN's to-edge passes for a program, for the name restoration; None:
            `default_to_edge_passes` (`qnn.to_edge_transform_and_lower_to_qnn` passes its own).

    Attributes:
        fold_spec: the decoded ``fold_constants`` spec, or None when folding is off.
        reports: one `QnnPartitionReport` per partitioned program, in call order.
        early_fold_reports: folds made before QNN's export pipeline (which crashes on control
            flow) of programs that call control flow (`qnn.control_flow.fold_control_flow_first`).
    """

    def __init__(self, compiler_specs: List[CompileSpec], skip_node_id_set: Optional[set] = None,
                 skip_node_op_set: Optional[set] = None, skip_mutable_buffer: bool = False,
                 preserve_edge_names: Optional[bool] = None, to_edge_passes: Optional[PassFactory] = None) -> None:
        from .sdk import load_qnn_sdk; load_qnn_sdk()  # first QNN use: the libraries (qnn/sdk.py), or QnnSdkError
        qnn_specs, self.fold_spec = split_compile_specs(compiler_specs)
        super().__init__(qnn_specs, skip_node_id_set, skip_node_op_set, skip_mutable_buffer)
        self.preserve_edge_names = preserve_edge_names
        self.to_edge_passes = to_edge_passes or self.default_to_edge_passes
        self.reports: list[QnnPartitionReport] = []
        self.early_fold_reports: list[FoldReport] = []
        self._folds: list[FoldRecord] = []
        self._aten_graph_id: Optional[int] = None

    @property
    def restores_names(self) -> bool:
        """Whether folded programs get their unfolded Edge names back (`preserve_edge_names`)."""
        return bool(self.skip_node_id_set if self.preserve_edge_names is None else self.preserve_edge_names)

    @property
    def fold_reports(self) -> list[FoldReport]:
        """The fold stage's reports, in the order the folds ran: `early_fold_reports`, then one
        per program this partitioner's hook folded."""
        return self.early_fold_reports + [f.report for f in self._folds]

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        """Fold the ATen program **in place** (hook of exir/backend/partitioner.py): QNN's to-edge
        passes (``get_to_edge_transform_passes(ep)`` in _passes/qnn_pass_manager.py) keep the
        program object they were built from and look constants up in it by name, so the folded
        constants have to appear in that same object, or they would lose their encodings. A
        program this partitioner already folded is returned as is. (A program that calls control
        flow is also folded before QNN's export pipeline: `control_flow.fold_control_flow_first`.)"""
        if self.fold_spec is None or any(f.program is exported_program for f in self._folds):
            self._aten_graph_id = id(exported_program.graph)
            return exported_program
        unfolded = EdgeNameMap.snapshot(exported_program, self.to_edge_passes) if self.restores_names else None
        result = fold_constants(exported_program, self.fold_spec.policy, inplace=True)
        self._folds.append(record_fold(result.program, result.report, unfolded, kept_whole_ops()))
        return result.program

    def default_to_edge_passes(self, program: ExportedProgram) -> list:
        """QNN's to-edge passes for this backend, bound to `program` (``get_to_edge_transform_passes``
        in _passes/qnn_pass_manager.py), from `qnn.pass_manager.pass_manager_cls`."""
        return pass_manager_cls(self.backend)().get_to_edge_transform_passes(
            program, compiler_specs=self.compiler_specs_snapshot,
            skip_node_id_set=set(self.skip_node_id_set), skip_node_op_set=set(self.skip_node_op_set))

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list, Optional[Callable[[torch.fx.Node], bool]]]:
        """executorch's table and filter (``get_skip_decomp_table()``, ``filter_fn``), minus the
        kept-whole nodes the fold stage declined (the report lists them), core ATen ops
        (`is_core_aten_op`) and nodes in control-flow bodies: `partition` tags top-level nodes
        only, and ``_replace_aten_ops_with_transformed_ops`` asks this filter about body nodes too."""
        table, upstream_filter = super().ops_to_not_decompose(ep)
        return table, _keep_whole_filter(ep.graph, declined_nodes(self._folds, ep, kept_whole_ops()), upstream_filter)

    def partition(self, edge_program: ExportedProgram) -> PartitionResult:
        """executorch's ``QnnPartitioner.partition`` (generate partitions, tag them) with our
        steps: a folded program first gets its unfolded names back (`restore_names`, when
        `restores_names`) and its encodings checked (`check_encodings`); the partitions HTP
        refuses stay untagged (`screen_partitions`); constants the CPU side reads stay untagged
        (`_tag`). Appends the program's `QnnPartitionReport` (`fold_partition_report`) to `reports`.

        Raises:
            EncodingLostError: a folded constant that fed a kept dequantize lost its encoding."""
        fold = fold_for(self._folds, edge_program)
        renamed, naming_seconds = restore_names(edge_program, fold)
        check_encodings(edge_program, fold)
        candidates, declined = self._generate(edge_program)
        kept, screened = screen_partitions(edge_program, candidates, refuses_static_graphs(self.backend))
        self._tag(kept, edge_program)
        self.reports.append(fold_partition_report(edge_program, self.backend.name, fold, self._aten_graph_id,
                                                  renamed, naming_seconds, declined, screened))
        log_skipped_names_gone(self.skip_node_id_set, fold, self.reports[-1])
        return PartitionResult(tagged_exported_program=edge_program, partition_tags=self.partition_tags)

    def generate_partitions(self, edge_program: ExportedProgram) -> List[Partition]:
        """executorch's hook, for callers that use it directly: `partition`'s screened partitions."""
        return screen_partitions(edge_program, self._generate(edge_program)[0], refuses_static_graphs(self.backend))[0]

    def _generate(self, edge_program: ExportedProgram) -> tuple[List[Partition], dict[str, str]]:
        """executorch's ``generate_partitions`` with `_OperatorSupport` as the support check:
        (the partitions, {node name: why QNN declined it})."""
        support = _OperatorSupport(edge_program, self.compiler_specs_snapshot, self.skip_node_id_set,
                                   self.skip_node_op_set)
        return generate_partitions_from_list_of_nodes(edge_program.graph_module, op_support=support), support.declined

    def _tag(self, partitions: List[Partition], edge_program: ExportedProgram) -> None:
        """The tagging steps of executorch's ``partition``: its ``tag_nodes``, then
        ``tag_constant_data`` and ``tag_mutated_buffer`` (exir/backend/utils.py), with
        `untag_constants_read_by_the_cpu_side` between the two."""
        self.tag_nodes(partitions, edge_program)
        tag_constant_data(edge_program)
        untag_constants_read_by_the_cpu_side(edge_program)
        if not self.skip_mutable_buffer:
            tag_mutated_buffer(edge_program)


class _OperatorSupport(ei.QnnOperatorSupport):
    """QNN's operator-support check (partition/qnn_partitioner.py), except that a node reading
    or producing a tensor with a data-dependent (unbacked) size is unsupported: QNN's node
    visitors build tensors from concrete sizes, and ``NodeVisitor.define_tensor``
    (builders/node_visitor.py) raises ``TypeError`` on such a node (``k[mask].sum()``) instead
    of declining it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.declined: dict[str, str] = {}  # node name -> why it stays on the CPU

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
        """Which of ``QnnOperatorSupport.is_node_supported``'s checks declined `node`, in its order
        (its tables, meta key and attributes are `qnn.executorch_internals`')."""
        if node.target in ei.not_supported_operator:
            return "not supported by QNN (executorch's not_supported_operator)"
        if node.target in ei.to_be_implemented_operator:
            return "not implemented in executorch's QNN backend (to_be_implemented_operator)"
        if ei.is_forced_fallback(node):
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
        tag = ei.delegation_tag(node)
        if tag is not None and any(u.op == "output" or calls_control_flow(u) for u in node.users):
            ei.remove_delegation_tag(node)
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


def _keep_whole_filter(top: torch.fx.Graph, decompose: set,
                       upstream_filter: Callable) -> Callable[[torch.fx.Node], bool]:
    """`QnnPartitioner.ops_to_not_decompose`'s filter: `upstream_filter` (QNN's ``filter_fn``)
    on top-level nodes, except `decompose` and the core ATen ops."""

    def keep_whole(node: torch.fx.Node) -> bool:
        return (node.graph is top and node not in decompose and upstream_filter(node)
                and not is_core_aten_op(node.target))

    return keep_whole


def _has_unbacked_size(node: torch.fx.Node) -> bool:
    for n in (node, *node.all_input_nodes):
        val = n.meta.get("val")
        if val is not None and free_unbacked_symbols(val):
            return True
    return False


__all__ = ["QnnPartitioner", "kept_whole_ops", "screen_partitions"]
