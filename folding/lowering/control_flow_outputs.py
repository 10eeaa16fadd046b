"""Lowering a program, folded or not, to a `.pte` that returns the right numbers with
executorch 1.5.1: the workaround for an executorch fault, as objects for its own lowering.

    folded = folding.fold_constants(ep).program
    pte = to_edge_transform_and_lower(folded).to_executorch(folding.executorch_backend_config())

executorch issue 21490 (open in 1.5.1; fixed upstream by PRs 21494 and 21818): the emitter
hands the outputs of a ``cond``/``map``/``scan`` body to the caller by pointer (``MoveCall``),
so they stay in the memory arena all control-flow bodies share and the next control-flow call
overwrites them: wrong numbers without an error, folded or not. The strict xfails of
`tests/test_executorch_upstream.py` fail once a release fixes it; this module can then go.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from ..core.executorch_internals import edge_ops
from ..control_flow.hops import bodies

logger = logging.getLogger(__name__)

# What executorch 1.5.1's emitter hands back by pointer from the body arena (exir/emit/_emitter.py
# ``_emit_cond``, ``_emit_map``, ``_emit_scan``); it does not emit ``while_loop``.
COPIED_TARGETS = (torch.ops.higher_order.cond, torch.ops.higher_order.map_impl, torch.ops.higher_order.scan)


class CopyControlFlowOutputs(PassBase):
    """Copy every output of a `COPIED_TARGETS` call into the caller's memory right after the
    call, in the top-level graph and in every control-flow body: the copy (``clone_op`` of the
    ``getitem``) is memory-planned in the caller's graph, so no later call overwrites it. Values
    are unchanged; each copy costs one tensor copy per call and the tensor's planned bytes.

    Each ``getitem`` first moves to right after its call (delegating a partition can leave one
    after the next ``cond``). A ``getitem`` read only by clones is not copied again, so applying
    the pass twice adds nothing; an unused one is not copied.

    Args:
        clone_op: the copy's op. Default: Edge ``aten.clone``, right for
            ``ExecutorchBackendConfig.passes``. As an Edge transform under executorch's default
            ``EdgeCompileConfig`` (dim order on) the verifier refuses it: pass
            ``dim_order_ops._clone_dim_order``, or use `copy_control_flow_outputs`.
    """

    def __init__(self, clone_op: Optional[Any] = None) -> None:
        super().__init__()
        self.clone_op = clone_op

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        clone_op = self.clone_op if self.clone_op is not None else edge_ops().edge.aten.clone.default
        copies = _copy_outputs(graph_module, clone_op)
        logger.debug("copied %d control-flow outputs out of the shared body arena", copies)
        return PassResult(graph_module, copies > 0)


def _is_copy_of(node: torch.fx.Node, item: torch.fx.Node) -> bool:
    """`node` is a ``clone`` (any dialect) of `item` alone."""
    return (node.op == "call_function" and "clone" in getattr(node.target, "__name__", str(node.target))
            and node.all_input_nodes == [item])


def _copy_outputs(gm: torch.fx.GraphModule, clone_op) -> int:
    """Copy the outputs of `COPIED_TARGETS` calls in `gm` and, recursively, in the bodies its
    calls reach (not ``gm.modules()``: a delegate's own graphs are not the runtime's to plan).
    Returns how many copies were inserted."""
    copies = 0
    moved = False
    for node in list(gm.graph.nodes):
        for _, body in bodies(node):
            copies += _copy_outputs(body, clone_op)
        if node.op != "call_function" or node.target not in COPIED_TARGETS:
            continue
        anchor = node
        for item in [u for u in node.users if u.target is operator.getitem]:
            anchor.append(item)  # right after the call: a later node may be another cond
            anchor = item
            moved = True
            if all(_is_copy_of(u, item) for u in item.users):  # unused, or copied already
                for u in item.users:  # keep the copies before the next call
                    anchor.append(u)
                    anchor = u
                continue
            with gm.graph.inserting_after(item):
                kept = gm.graph.call_function(clone_op, (item,))
            kept.meta = dict(item.meta)
            item.replace_all_uses_with(kept, delete_user_cb=lambda user, kept=kept: user is not kept)
            anchor = kept
            copies += 1
    if moved:
        gm.graph.lint()
        gm.recompile()
    return copies


def executorch_backend_config(mutated_buffers: Sequence[str] = (), *, copy_control_flow_outputs: bool = True,
                              passes: Sequence = (), **config):
    """The ``executorch.exir.ExecutorchBackendConfig`` for ``to_executorch`` under which the
    `.pte` returns what the program computes, folded or not, with executorch 1.5.1.

    Args:
        mutated_buffers: fully qualified names of buffers the program writes, whose initial
            values the `.pte` must hold (ExecuTorch leaves them uninitialised unless
            exir/passes/init_mutable_pass.py's ``InitializedMutableBufferPass`` names them).
        copy_control_flow_outputs: add `CopyControlFlowOutputs` (off only to see the fault).
        passes: your own ``ExecutorchBackendConfig.passes``, run before the copy.
        config: any other ``ExecutorchBackendConfig`` field.

    Raises:
        TypeError: a keyword that is not an ``ExecutorchBackendConfig`` field.
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    all_passes: list = list(passes)
    if copy_control_flow_outputs:
        all_passes.append(CopyControlFlowOutputs())
    if mutated_buffers:
        all_passes.append(InitializedMutableBufferPass(list(mutated_buffers)))
    return ExecutorchBackendConfig(passes=all_passes, **config)


def copy_control_flow_outputs(edge_manager, *, inplace: bool = False):
    """`CopyControlFlowOutputs` applied to every program of an ``EdgeProgramManager`` already
    partitioned and lowered (a partitioner may drop a copy it takes into a delegate), so that
    ``to_executorch()`` needs no config; with the copy op the program's Edge verifier accepts.

    Returns:
        with `inplace`, `edge_manager`, its programs rewritten; else a new, re-verified
        ``EdgeProgramManager`` (``EdgeProgramManager.transform``; `edge_manager` is unchanged).
    """
    from ..core.dialect import dialect_op

    passes = {name: CopyControlFlowOutputs(dialect_op(edge_manager.exported_program(name), "aten.clone.default"))
              for name in edge_manager.methods}
    if not inplace:
        return edge_manager.transform({name: [p] for name, p in passes.items()})
    for name, copy_pass in passes.items():
        copy_pass(edge_manager.exported_program(name).graph_module)
    return edge_manager


def control_flow_calls(program: ExportedProgram) -> list[str]:
    """Names of the `COPIED_TARGETS` calls in `program`, in its bodies by path
    (``true_graph_0/cond_1``), in graph order."""
    out: list[str] = []

    def visit(gm: torch.fx.GraphModule, prefix: str) -> None:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in COPIED_TARGETS:
                out.append(prefix + node.name)
            for attr, body in bodies(node):
                visit(body, f"{prefix}{attr}/")

    visit(program.graph_module, "")
    return out


def lowering_note(program: ExportedProgram) -> Optional[str]:
    """The `FoldReport.notes` line for a folded `program` with a `COPIED_TARGETS` call (which
    config to pass to ``to_executorch``, and why); None without one."""
    calls = control_flow_calls(program)
    if not calls:
        return None
    shown = ", ".join(calls[:5]) + (f" and {len(calls) - 5} more" if len(calls) > 5 else "")
    return (f"the program has control flow ({shown}): lower it with "
            "`to_executorch(folding.executorch_backend_config())` (mutated buffers' names as its first "
            "argument), which copies each output out of the memory all bodies share; executorch 1.5.1 "
            "otherwise lets a later cond/map/scan overwrite it and the .pte returns wrong numbers without "
            "an error (executorch issue 21490)")
