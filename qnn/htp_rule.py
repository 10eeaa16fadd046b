"""HTP refuses a graph whose inputs are all static.

QNN's HTP backend finalizes a graph only when at least one of its inputs is written by the
application at run time (a ``QNN_TENSOR_TYPE_APP_WRITE`` tensor); a graph fed only by
``QNN_TENSOR_TYPE_STATIC`` tensors (weights, buffers, lifted constants) is refused: its context
compile fails with ``No graph inputs present for graph [0]`` (error 0x7532). The check lives in
the SDK (libQnnHtp.so), not in executorch's Python, so executorch 1.5.1's ``QnnPartitioner``
(executorch/backends/qualcomm/partition/qnn_partitioner.py) emits such partitions. This module
mirrors the SDK's refusal at partition time: the partition stays on the CPU, as it would have
to on a device. tests/qnn/test_htp_premise.py lowers such a program through executorch's stock
partitioner on the real HTP libraries and checks the refusal.

Static vs. runtime follows QNN's own tensor classification in
executorch/backends/qualcomm/builders/utils.py (``is_parameter``, ``is_graph_input``,
``is_mutable_buffer_input``), which ``NodeVisitor.get_tensor_type`` (builders/node_visitor.py)
turns into ``STATIC`` or ``APP_WRITE``: a parameter, a buffer the program does not mutate, a
lifted tensor constant and a ``get_attr`` are static; a user input, a mutated buffer, and any
value computed outside the partition are written at run time.

GPU and LPAI accept graphs without runtime inputs; the rule applies to HTP only
(`refuses_static_graphs`).
"""

from __future__ import annotations

from typing import Iterable, List

import torch
from executorch.backends.qualcomm.builders.utils import is_graph_input, is_mutable_buffer_input
from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType
from torch.export import ExportedProgram


def refuses_static_graphs(backend_type: QnnExecuTorchBackendType) -> bool:
    """True for the backends that refuse a graph without a runtime input (HTP)."""
    return backend_type == QnnExecuTorchBackendType.kHtpBackend


def partition_inputs(nodes: Iterable[torch.fx.Node]) -> List[torch.fx.Node]:
    """The nodes outside `nodes` that nodes of `nodes` read, in graph order."""
    inside = set(nodes)
    outside = {i for n in inside for i in n.all_input_nodes if i not in inside}
    if not outside:
        return []
    graph = next(iter(outside)).graph
    return [n for n in graph.nodes if n in outside]


def is_runtime_input(node: torch.fx.Node, edge_program: ExportedProgram) -> bool:
    """True when QNN would give `node`, read by a partition, an ``APP_WRITE`` tensor."""
    if node.op == "placeholder":
        return bool(is_graph_input(node, edge_program) or is_mutable_buffer_input(node, edge_program))
    return node.op != "get_attr"

