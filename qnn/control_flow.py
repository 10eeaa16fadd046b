"""Control flow on the QNN path (executorch 1.5.1).

Two of QNN's passes crash on higher-order ops (``torch.cond``, ``map``, ``scan``,
``while_loop``): ``LiftConstantScalarOperands`` (export and annotation pipelines) reads
``node.target._schema``, which a higher-order op does not have, and ``I64toI32`` (to-edge
pipeline) reads ``meta["val"]`` of every ``get_attr``, which a body's ``get_attr`` does not have.
`qnn.pass_manager.pass_manager_cls` is QNN's pass manager with variants of both that leave
control flow alone (`qnn._passes`, one per file); the QNN lowering builds every pipeline from
it. QNN's partitioner tags only top-level nodes, so a
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

from typing import Optional

import torch
from torch.export import ExportedProgram

from folding import FoldPolicy, FoldReport, fold_constants
from folding.core.ops import op_name

from .errors import ControlFlowNotSupportedError


def control_flow_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """The top-level nodes of `program` that call a higher-order op (cond, map_impl, scan,
    while_loop, wrap_with_autocast …)."""
    return [n for n in program.graph.nodes if calls_control_flow(n)]


def calls_control_flow(node: torch.fx.Node) -> bool:
    """True when `node` calls a higher-order op (``torch._ops.HigherOrderOperator``)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


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
