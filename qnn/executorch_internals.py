"""Every executorch internal the QNN integration depends on, in one place, each with the
executorch 1.5.1 source it reads.

"Internal" here: a module with a private path segment (``executorch.backends.qualcomm._passes``),
a method or attribute of an executorch class that is not part of the documented ``Partitioner`` /
``ExportPass`` API (read, called or overridden), a ``node.meta`` key executorch writes or reads,
and a module-level table that no documentation promises. executorch's documented API
(``executorch.exir``'s ``to_edge_transform_and_lower``, ``Partitioner``, ``PartitionResult``,
``CompileSpec``, ``executorch.runtime``, ``executorch.export``) and the QNN helpers executorch's
own flows and examples call by their public names (``generate_qnn_executorch_option``,
``get_skip_decomp_table``, ``filter_fn``, ``qnn_edge_config``, ``flatbuffer_to_option``,
``QnnManagerContext``, ``is_graph_input``) stay where they are used.

Each internal has a test in ``tests/qnn/test_executorch_internals.py`` that fails when an
executorch upgrade changes it. No other ``qnn`` module imports a private executorch module
(``tests/test_architecture.py``). Where a ``qnn`` class overrides or calls a method of an
executorch class, the code stays in that class (a subclass must define its overrides) and
`OVERRIDDEN_METHODS` / `CALLED_METHODS` / `READ_ATTRIBUTES` name it here, with the
parameters executorch 1.5.1 gives it. executorch's ``QnnPartitioner`` and ``QnnOperatorSupport``
(partition/qnn_partitioner.py, a public module) are taken from here too, because `qnn`
subclasses them through methods and attributes outside the ``Partitioner`` API.

One dependency lives outside this module: `qnn.sdk.prevent_sdk_download` sets ``QNN_SDK_ROOT``
to the empty string, which executorch's ``setup_qnn_sdk`` (backends/qualcomm/utils/
qnn_sdk_setup.py) reads as "the caller manages the SDK". ``qnn/sdk.py`` imports no executorch
module (``import qnn`` runs it before executorch's QNN code is imported), so it does not import
this module; the test here pins that behaviour too.
"""

from __future__ import annotations

import contextlib
import operator
import types
from dataclasses import dataclass
from typing import Iterator

import torch
from executorch.backends.qualcomm._passes.i64_to_i32 import I64toI32
from executorch.backends.qualcomm._passes.lift_constant_scalar_operands import LiftConstantScalarOperands
from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager, get_qnn_pass_manager_cls
from executorch.backends.qualcomm.partition.common_defs import not_supported_operator, to_be_implemented_operator
from executorch.backends.qualcomm.partition.qnn_partitioner import QnnOperatorSupport
from executorch.backends.qualcomm.partition.qnn_partitioner import QnnPartitioner as ExecutorchQnnPartitioner
from executorch.backends.qualcomm.utils.constants import QCOM_FALLBACK_NODE, QCOM_QUANT_ATTRS

__all__ = [
    "BODY_VALUE", "CALLED_METHODS", "DELEGATION_TAG", "ExecutorchQnnPartitioner", "FALLBACK_NODE", "I64toI32",
    "LiftConstantScalarOperands", "Method", "OVERRIDDEN_METHODS", "QUANT_ATTRS", "QnnOperatorSupport",
    "QnnPassManager", "READ_ATTRIBUTES", "aten_overload", "body_get_attrs_valued", "call_operator_without_cast",
    "delegation_tag", "get_qnn_pass_manager_cls", "has_quant_attrs", "is_forced_fallback",
    "not_supported_operator", "quant_attrs", "remove_delegation_tag", "to_be_implemented_operator",
]

# -- private modules: the QNN passes and pass manager (backends/qualcomm/_passes/) ---------------
# I64toI32 (_passes/i64_to_i32.py) and LiftConstantScalarOperands
# (_passes/lift_constant_scalar_operands.py) are the two passes `qnn._passes` subclasses;
# QnnPassManager and get_qnn_pass_manager_cls (_passes/qnn_pass_manager.py) are what
# `qnn.pass_manager.pass_manager_cls` derives from. executorch has no public path to any of them.

# -- node.meta keys ------------------------------------------------------------------------------

DELEGATION_TAG = "delegation_tag"
"""The key a partitioner's tags live under: QNN's ``QnnPartitioner.tag_nodes``
(partition/qnn_partitioner.py) and ``tag_constant_data`` / ``tag_mutated_buffer``
(exir/backend/utils.py) write it, ``to_backend`` (exir/backend/backend_api.py) reads it."""

QUANT_ATTRS = QCOM_QUANT_ATTRS
"""``"quant_attrs"`` (utils/constants.py): a node's QNN encoding (scale, zero point, dtype,
range), written by QNN's to-edge passes (``AnnotateQuantAttrs``, ``FoldQDQ``) and read by its
node visitors."""

FALLBACK_NODE = QCOM_FALLBACK_NODE
"""``"fallback_node"`` (utils/constants.py): ``QnnOperatorSupport.is_node_supported`` declines a
node that carries it (LPAI's fallback pass sets it)."""


def delegation_tag(node: torch.fx.Node):
    """The partition tag a partitioner gave `node`, or None (`DELEGATION_TAG`)."""
    return node.meta.get(DELEGATION_TAG)


def remove_delegation_tag(node: torch.fx.Node) -> None:
    """Untag `node` (it must be tagged): ``to_backend`` then leaves it outside every partition."""
    del node.meta[DELEGATION_TAG]


def has_quant_attrs(node: torch.fx.Node) -> bool:
    """`node` carries a QNN encoding (`QUANT_ATTRS`)."""
    return QUANT_ATTRS in node.meta


def quant_attrs(node: torch.fx.Node) -> dict:
    """`node`'s QNN encoding (`QUANT_ATTRS`; KeyError when it has none)."""
    return node.meta[QUANT_ATTRS]


def is_forced_fallback(node: torch.fx.Node) -> bool:
    """`node` is marked to stay on the CPU (`FALLBACK_NODE`), as ``QnnOperatorSupport`` reads it."""
    return bool(node.meta.get(FALLBACK_NODE, False))


# -- module-level tables (partition/common_defs.py) ----------------------------------------------
# not_supported_operator and to_be_implemented_operator: the Edge ops QnnOperatorSupport declines
# before asking QNN, in that order (`qnn.partitioner._OperatorSupport._why_declined` names them).

# -- private attributes and planted values -------------------------------------------------------


def aten_overload(target):
    """The ATen overload behind an Edge op (``EdgeOpOverload._op``, exir/dialects/edge/_ops.py,
    which forwards ``tags`` and the schema to it), or `target` itself for an ATen overload or
    any other target. (torch's own ``OpOverload`` also has an ``_op``: the C++ callable, which
    has no ``tags``, so an ATen overload is returned as is.)"""
    if isinstance(target, torch._ops.OpOverload):
        return target
    return getattr(target, "_op", target)


def call_operator_without_cast(pass_: I64toI32, op, args, kwargs, meta):
    """``ExportPass.call_operator`` on an `I64toI32` pass: the op retraced as is, without the
    int32 cast ``I64toI32.call_operator`` adds (``I64toI32`` derives from ``ExportPass`` directly,
    so ``super(I64toI32, pass_)`` is ExportPass's)."""
    return super(I64toI32, pass_).call_operator(op, args, kwargs, meta)


BODY_VALUE = types.SimpleNamespace(constant=None)
"""The ``meta["val"]`` `body_get_attrs_valued` plants on a control-flow body's ``get_attr``.
``I64toI32._cast_constant_to_int32`` reads ``meta["val"]`` of every ``get_attr`` (a body's has
none: ``KeyError: 'val'``); of this value it reads ``.constant`` (builders/utils.py
``is_constant``: None is "not a constant") and whether it is a FakeTensor (it is not: nothing
to cast), so the node is left as it was."""


@contextlib.contextmanager
def body_get_attrs_valued(graph_module: torch.fx.GraphModule) -> Iterator[list]:
    """For the block, every ``get_attr`` of `graph_module` that reads a module (a control-flow
    body) and has no ``meta["val"]`` holds `BODY_VALUE`; removed afterwards. Yields those nodes."""
    bodies = [n for n in graph_module.graph.find_nodes(op="get_attr")
              if "val" not in n.meta and isinstance(operator.attrgetter(n.target)(graph_module), torch.nn.Module)]
    for n in bodies:
        n.meta["val"] = BODY_VALUE
    try:
        yield bodies
    finally:
        for n in bodies:
            del n.meta["val"]


# -- methods and attributes of executorch classes that qnn classes override, call or read --------


@dataclass(frozen=True)
class Method:
    """A method of an executorch class, with the parameter names executorch 1.5.1 gives it
    (``self``/``cls`` excluded), and the ``qnn`` class that overrides or calls it."""

    owner: type
    name: str
    parameters: tuple[str, ...]
    user: str


OVERRIDDEN_METHODS: tuple[Method, ...] = (
    # backends/qualcomm/_passes/i64_to_i32.py; `qnn._passes.I64toI32SkippingBodies`
    Method(I64toI32, "_cast_constant_to_int32", ("graph_module",), "I64toI32SkippingBodies"),
    Method(I64toI32, "call_operator", ("op", "args", "kwargs", "meta"), "I64toI32SkippingBodies"),
    Method(I64toI32, "call", ("graph_module",), "I64toI32SkippingBodies"),
    # backends/qualcomm/_passes/lift_constant_scalar_operands.py
    Method(LiftConstantScalarOperands, "_create_tensor_args", ("node", "gm"), "LiftScalarOperandsSkippingControlFlow"),
    # backends/qualcomm/_passes/qnn_pass_manager.py (classmethods); `qnn.pass_manager.pass_manager_cls`
    Method(QnnPassManager, "get_export_passes", (), "ControlFlowAwareQnnPassManager"),
    Method(QnnPassManager, "get_annotation_passes", (), "ControlFlowAwareQnnPassManager"),
    Method(QnnPassManager, "get_default_pass_activations", (), "ControlFlowAwareQnnPassManager"),
    Method(QnnPassManager, "get_passes_dependency_for_capture_program", (), "ControlFlowAwareQnnPassManager"),
    # backends/qualcomm/partition/qnn_partitioner.py; `qnn.QnnPartitioner` (the Partitioner hooks
    # ops_to_not_decompose, partition, transform_for_pre_decomposition (exir/backend/partitioner.py)
    # are public API; the constructors are called positionally by the subclasses)
    Method(ExecutorchQnnPartitioner, "__init__",
           ("compiler_specs", "skip_node_id_set", "skip_node_op_set", "skip_mutable_buffer"), "QnnPartitioner"),
    Method(ExecutorchQnnPartitioner, "generate_partitions", ("edge_program",), "QnnPartitioner"),
    Method(ExecutorchQnnPartitioner, "ops_to_not_decompose", ("ep",), "QnnPartitioner"),
    Method(ExecutorchQnnPartitioner, "partition", ("edge_program",), "QnnPartitioner"),
    Method(ExecutorchQnnPartitioner, "transform_for_pre_decomposition", ("exported_program",), "QnnPartitioner"),
    Method(QnnOperatorSupport, "__init__", ("edge_program", "compiler_specs", "skip_node_id_set",
                                            "skip_node_op_set", "is_qnn_partitioner", "phase"), "_OperatorSupport"),
    Method(QnnOperatorSupport, "is_node_supported", ("_", "node"), "_OperatorSupport"),
)
"""Methods of executorch classes that a ``qnn`` subclass overrides (``_cast_constant_to_int32``
and ``_create_tensor_args`` are private: no public hook of those passes serves)."""

CALLED_METHODS: tuple[Method, ...] = (
    Method(ExecutorchQnnPartitioner, "tag_nodes", ("partitions", "edge_program"), "QnnPartitioner"),
    Method(QnnPassManager, "get_to_edge_transform_passes",
           ("exported_program", "passes_job", "dep_table", "compiler_specs", "skip_node_id_set",
            "skip_node_op_set", "convert_linear_to_conv2d"), "qnn.lowering, QnnPartitioner"),
    Method(QnnPassManager, "transform_for_export_pipeline", ("exported_program",), "qnn.lowering"),
)
"""Methods of executorch classes that ``qnn`` code calls, outside the documented API."""

READ_ATTRIBUTES: dict[type, tuple[str, ...]] = {
    # set in QnnPartitioner.__init__; read by `qnn.QnnPartitioner` and `qnn.export_recipe`
    ExecutorchQnnPartitioner: ("backend", "compiler_specs_snapshot", "skip_node_id_set", "skip_node_op_set",
                               "skip_mutable_buffer", "partition_tags"),
    # set in QnnOperatorSupport.__init__; read by `qnn.partitioner._OperatorSupport._why_declined`
    QnnOperatorSupport: ("node_visitors", "skip_node_id_set", "skip_node_op_set"),
    # class attribute (the int32 cast it inserts); read by `qnn._passes.I64toI32SkippingBodies`
    I64toI32: ("copy_op",),
}
"""Instance or class attributes of executorch classes that ``qnn`` code reads."""
