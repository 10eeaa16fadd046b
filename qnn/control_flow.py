"""Control flow on the QNN path (executorch 1.5.1).

QNN's ``LiftConstantScalarOperands`` pass crashes on any higher-order op (see
`ControlFlowNotSupportedError`), and it runs in ``transform_for_export_pipeline``, before the
fold stage's usual position. With ``fold_constants`` on, a program that calls control flow is
therefore folded once before that pipeline: a ``cond`` whose predicate is constant is replaced
by its branch, a loop or map on constants by its result, and constant code leaves the bodies.
What control flow is left reads runtime values; the QNN path then stops with a typed error
instead of QNN's AttributeError.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.export import ExportedProgram

from folding import FoldPolicy, FoldReport, fold_constants
from folding.ops import op_name

from .errors import ControlFlowNotSupportedError


def control_flow_nodes(program: ExportedProgram) -> list[torch.fx.Node]:
    """The top-level nodes of `program` that call a higher-order op (cond, map_impl, scan,
    while_loop, wrap_with_autocast …)."""
    return [
        n for n in program.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)
    ]


def fold_control_flow_first(program: ExportedProgram, policy: Optional[FoldPolicy]) -> Optional[FoldReport]:
    """Fold `program` in place when it calls control flow and `policy` is given (folding on);
    then require that no control flow is left. Returns the fold's report (None when it did not
    fold), which `qnn.QnnPartitioner.fold_reports` keeps with the hook's.

    Raises:
        ControlFlowNotSupportedError: naming the first control-flow node left.
    """
    report = None
    if control_flow_nodes(program) and policy is not None:
        report = fold_constants(program, policy, inplace=True).report
    require_no_control_flow(program, folded=policy is not None)
    return report


QUANTIZATION_HINT = (
    "QnnQuantizer's annotation pipeline runs the same pass; fold the float program first "
    "(folding.fold_constants(ep).program) to remove conds with constant predicates and loops on constants"
)


def require_no_control_flow(program: ExportedProgram, *, folded: bool = True, hint: Optional[str] = None) -> None:
    """Stop before QNN's passes crash on control flow (`ControlFlowNotSupportedError`): called
    before the QNN export and to-edge pipelines, and before QNN's quantization annotation
    (``QnnQuantizer.transform_for_annotation`` runs ``LiftConstantScalarOperands`` too).

    Raises:
    ControlFlowNotSupportedError: `program` calls a higher-order op; the message names the
        node, what it reads at runtime, and the upstream limitation."""
    nodes = control_flow_nodes(program)
    if not nodes:
        return
    n = nodes[0]
    hint = hint or (
        "folding removed every cond with a constant predicate and every loop on constants; this one reads "
        "runtime values"
        if folded
        else "enable fold_constants in the compile spec to remove conds with constant predicates and loops on constants"
    )
    raise ControlFlowNotSupportedError(
        f"node {n.name!r} ({op_name(n.target)}) is control flow, which executorch 1.5.1's QNN passes cannot lower: "
        "LiftConstantScalarOperands (backends/qualcomm/_passes/lift_constant_scalar_operands.py) reads "
        "node.target._schema, which higher-order ops do not have, and I64toI32 (_passes/i64_to_i32.py) reads "
        f"meta['val'] of each body's get_attr, which has none. {hint}. Lower this program with another "
        f"backend (XNNPACK, portable), or export the part around the control flow separately."
    )
