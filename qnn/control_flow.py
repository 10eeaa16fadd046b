"""Control flow on the QNN path (executorch 1.5.1).

Two of QNN's passes crash on higher-order ops (``torch.cond``, ``map``, ``scan``,
``while_loop``): ``LiftConstantScalarOperands`` (export and annotation pipelines) reads
``node.target._schema``, which a higher-order op does not have, and ``I64toI32`` (to-edge
pipeline) reads ``meta["val"]`` of every ``get_attr``, which a body's ``get_attr`` does not have.
`pass_manager_cls` is QNN's pass manager with variants of both that leave control flow alone
(the shape of executorch PR 22252, "skip higher-order ops in LiftConstantScalarOperands"); the
QNN lowering builds every pipeline from it. QNN's partitioner tags only top-level nodes, so a
control-flow call and its bodies run on the CPU and the code around them is delegated
(`qnn.QnnPartitioner.ops_to_not_decompose` decomposes kept-whole ops inside bodies, which no
partition can take).

With ``fold_constants`` on, a program that calls control flow is folded once before QNN's
export pipeline (`fold_control_flow_first`): a ``cond`` whose predicate is constant is replaced
by its branch, a loop or map on constants by its result, and constant code leaves the bodies,
so what reaches QNN's export passes is top-level code those passes transform.

QNN's quantizer (``QnnQuantizer.transform_for_annotation``) builds its annotation pipeline from
executorch's own pass manager; a program with control flow stops there with
`ControlFlowNotSupportedError` (`require_no_control_flow`) instead of QNN's AttributeError.
"""

from __future__ import annotations

import functools
import operator
import types
from typing import Optional

import torch
from executorch.backends.qualcomm._passes.i64_to_i32 import I64toI32
from executorch.backends.qualcomm._passes.lift_constant_scalar_operands import LiftConstantScalarOperands
from executorch.backends.qualcomm._passes.qnn_pass_manager import QnnPassManager, get_qnn_pass_manager_cls
from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType
from torch.export import ExportedProgram

from folding import FoldPolicy, FoldReport, fold_constants
from folding.ops import op_name

from .errors import ControlFlowNotSupportedError


def control_flow_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """The top-level nodes of `program` that call a higher-order op (cond, map_impl, scan,
    while_loop, wrap_with_autocast …)."""
    return [n for n in program.graph.nodes if _calls_hop(n)]


def _calls_hop(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


class LiftScalarOperandsSkippingControlFlow(LiftConstantScalarOperands):
    """QNN's ``LiftConstantScalarOperands`` (_passes/lift_constant_scalar_operands.py), which
    turns scalar operands into tensor constants for QNN's op builders, except for higher-order
    ops: their operands are tensors and bodies, and they have no ``_schema`` to read."""

    def _create_tensor_args(self, node: torch.fx.Node, gm: torch.fx.GraphModule) -> dict:
        if _calls_hop(node):
            return {}
        return super()._create_tensor_args(node, gm)


class I64toI32SkippingBodies(I64toI32):
    """QNN's ``I64toI32`` (_passes/i64_to_i32.py), which casts int64 constants and ops to int32,
    except where control flow would see the cast:

    - the ``get_attr`` of a control-flow body: the pass reads ``meta["val"]`` of every
      ``get_attr``, and a body (a GraphModule) has none. For the duration of the cast the
      body's ``get_attr`` holds `_BODY_VALUE`, which the pass reads as a value that is neither
      a constant nor a tensor; the node is left as it was;
    - an int64 value that a control-flow call reads (a ``while_loop``'s int64 counter, made by
      ``full`` or stored as a constant): its bodies were traced for int64, and torch refuses a
      carry whose dtype differs from what the body returns. The call keeps reading the int64
      value (the body runs on the CPU, where int64 is fine); other readers get the cast.
    """

    _KEEP_INT64 = "qnn_control_flow_keeps_int64"

    def call(self, graph_module: torch.fx.GraphModule):
        for n in graph_module.graph.nodes:
            if any(_calls_hop(u) for u in n.users):
                n.meta[self._KEEP_INT64] = True
        try:
            return super().call(graph_module)
        finally:
            for n in graph_module.graph.nodes:
                n.meta.pop(self._KEEP_INT64, None)

    def call_operator(self, op, args, kwargs, meta):
        if meta.data.get(self._KEEP_INT64):
            return super(I64toI32, self).call_operator(op, args, kwargs, meta)  # ExportPass's: no cast
        return super().call_operator(op, args, kwargs, meta)

    def _cast_constant_to_int32(self, graph_module: torch.fx.GraphModule) -> None:
        bodies = [n for n in graph_module.graph.find_nodes(op="get_attr")
                  if "val" not in n.meta and isinstance(operator.attrgetter(n.target)(graph_module), torch.nn.Module)]
        for n in bodies:
            n.meta["val"] = _BODY_VALUE
        before = set(graph_module.graph.nodes)
        try:
            super()._cast_constant_to_int32(graph_module)
        finally:
            for n in bodies:
                del n.meta["val"]
        for cast in [n for n in graph_module.graph.nodes if n not in before and n.target is self.copy_op]:
            for user in [u for u in cast.users if _calls_hop(u)]:  # the int64 constant, as traced
                user.replace_input_with(cast, cast.args[0])


# What I64toI32 reads of a get_attr's value: ``.constant`` (builders/utils.py ``is_constant``:
# None is "not a constant") and whether it is a FakeTensor (it is not: no int64 tensor to cast).
_BODY_VALUE = types.SimpleNamespace(constant=None)


_VARIANTS = {LiftConstantScalarOperands: LiftScalarOperandsSkippingControlFlow, I64toI32: I64toI32SkippingBodies}


def _swap(p):
    return _VARIANTS.get(p, p)


def with_control_flow_passes(table: Optional[dict]) -> Optional[dict]:
    """A caller's ``passes_job`` or ``dep_table`` (keyed by QNN pass classes, as
    ``get_capture_program_passes()`` gives it) with the control-flow variants in place of the
    passes they replace; None stays None."""
    if table is None:
        return None
    out = type(table)()
    for k, v in table.items():
        out[_swap(k)] = [_swap(x) for x in v] if isinstance(v, list) else v
    return out


@functools.cache
def pass_manager_cls(
    backend_type: QnnExecuTorchBackendType = QnnExecuTorchBackendType.kHtpBackend,
) -> type[QnnPassManager]:
    """executorch's QNN pass manager for `backend_type` (``get_qnn_pass_manager_cls`` in
    backends/qualcomm/_passes/qnn_pass_manager.py) with the two passes that crash on control
    flow replaced by `LiftScalarOperandsSkippingControlFlow` and `I64toI32SkippingBodies`, in
    the export, annotation and to-edge pipelines and in the to-edge passes' ordering table.
    Everything else is executorch's. Use it where you would use ``QnnPassManager``, e.g.
    ``qnn.pass_manager_cls()().transform_for_export_pipeline(ep)``."""
    base = get_qnn_pass_manager_cls(backend_type)

    class ControlFlowAwareQnnPassManager(base):
        @classmethod
        def get_export_passes(cls):
            return [_swap(p) for p in super().get_export_passes()]

        @classmethod
        def get_annotation_passes(cls):
            return [_swap(p) for p in super().get_annotation_passes()]

        @classmethod
        def get_default_pass_activations(cls):
            return [(_swap(p), on) for p, on in super().get_default_pass_activations()]

        @classmethod
        def get_passes_dependency_for_capture_program(cls):
            table = super().get_passes_dependency_for_capture_program()
            return {_swap(k): [_swap(v) for v in vs] for k, vs in table.items()}

    ControlFlowAwareQnnPassManager.__qualname__ = f"ControlFlowAware{base.__name__}"
    return ControlFlowAwareQnnPassManager


def fold_control_flow_first(program: ExportedProgram, policy: Optional[FoldPolicy]) -> Optional[FoldReport]:
    """Fold `program` in place when it calls control flow and `policy` is given (folding on),
    so that QNN's export passes see the code of every ``cond`` with a constant predicate, every
    loop on constants and the constant code of bodies at the top level. Returns the fold's
    report (None when it did not fold), which `qnn.QnnPartitioner.fold_reports` keeps with the
    hook's. What control flow is left reads runtime values and stays on the CPU."""
    if control_flow_nodes(program) and policy is not None:
        return fold_constants(program, policy, inplace=True).report
    return None


QUANTIZATION_HINT = (
    "QnnQuantizer's annotation pipeline (QnnQuantizer.transform_for_annotation) builds executorch's own "
    "pass manager, whose LiftConstantScalarOperands reads node.target._schema, which higher-order ops do "
    "not have; fold the float program first (folding.fold_constants(ep).program) to remove conds with "
    "constant predicates and loops on constants"
)


def require_no_control_flow(program: ExportedProgram) -> None:
    """Stop before executorch's QNN annotation pipeline crashes on control flow: called before
    QNN's quantization annotation (``QnnQuantizer.transform_for_annotation`` runs
    ``LiftConstantScalarOperands``).

    Raises:
        ControlFlowNotSupportedError: `program` calls a higher-order op; the message names the
            node and the upstream pass.
    """
    nodes = control_flow_nodes(program)
    if nodes:
        n = nodes[0]
        raise ControlFlowNotSupportedError(
            f"node {n.name!r} ({op_name(n.target)}) is control flow, which executorch 1.5.1's QNN quantizer "
            f"cannot annotate: {QUANTIZATION_HINT}. Lowering (not quantizing) a program with control flow works: "
            "qnn.to_edge_transform_and_lower_to_qnn keeps the control flow on the CPU."
        )
