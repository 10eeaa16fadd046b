"""Lowering a program, folded or not, to a `.pte` that returns the right numbers with
executorch 1.5.1: the workaround for an executorch fault, as objects to pass to its own
lowering functions. (An XNNPACK fault's workaround, `folding.xnnpack_partitioner`, is the
leaf module `folding.xnnpack`: nothing the fold or its report runs imports it.)

    from executorch.exir import to_edge_transform_and_lower
    import folding

    folded = folding.fold_constants(ep).program
    pte = to_edge_transform_and_lower(folded).to_executorch(folding.executorch_backend_config())

executorch issue 21490 (open in 1.5.1; PRs 21494 and 21818 fix it upstream): the emitter
hands the outputs of a ``cond``/``map``/``scan`` body to the caller with a ``MoveCall``, a
pointer move, so they stay in the memory arena that every control-flow body shares, and the
next control-flow call overwrites them. The `.pte` returns wrong numbers without an error,
folded or not; which programs hit it depends on the memory plan, so a fold can move a
program from right by luck to wrong. `CopyControlFlowOutputs` copies each such output into
the caller's memory right after the call; `executorch_backend_config` puts it in the
``ExecutorchBackendConfig`` of ``to_executorch``, `copy_control_flow_outputs` applies it to
an ``EdgeProgramManager`` that is already lowered (for wrappers that hand the manager to
their caller).

It can go once executorch is fixed: `tests/test_executorch_upstream.py` pins the fault with
strict xfails, which start passing (and so fail) on the release that fixes it.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from .executorch_internals import edge_ops
from .hops import bodies

logger = logging.getLogger(__name__)

# The higher-order ops executorch 1.5.1's emitter lowers into jumps over a body arena shared by
# all of them, handing their outputs back by pointer (exir/emit/_emitter.py, ``_emit_cond``,
# ``_emit_map``, ``_emit_scan``: ``MoveCall``). ``while_loop`` is not emitted by 1.5.1.
COPIED_TARGETS = (torch.ops.higher_order.cond, torch.ops.higher_order.map_impl, torch.ops.higher_order.scan)


def _is_copy_of(node: torch.fx.Node, item: torch.fx.Node) -> bool:
    """`node` copies `item` into the caller's memory and reads nothing else: a ``clone`` in any
    dialect (ATen, Edge, Edge dim-order), so it can move to right after `item`."""
    return (node.op == "call_function" and "clone" in getattr(node.target, "__name__", str(node.target))
            and node.all_input_nodes == [item])


class CopyControlFlowOutputs(PassBase):
    """Copy every output of a ``cond``/``map_impl``/``scan`` (`COPIED_TARGETS`) into the
    caller's memory right after the call, in the top-level graph and in every control-flow body.

    The copy (``clone_op`` of the ``getitem``) is memory-planned in the caller's graph, so a
    later control-flow call, whose body writes the shared arena, cannot overwrite it: the
    workaround for executorch issue 21490 (fixed upstream by PRs 21494 and 21818, open at
    executorch 1.5.1); it can go once executorch ships the fix (the strict xfail
    ``test_executorch_keeps_a_cond_output_alive_across_the_next_cond`` in
    `tests/test_executorch_upstream.py` then passes, and so fails). Values are unchanged; each
    copy costs one tensor copy per call and the tensor's bytes of planned memory.

    Each ``getitem`` first moves to right after its call: delegating a partition can leave a
    ``getitem`` after the next ``cond`` (fuzz case 26000182, XNNPACK), and the copy must run
    before that ``cond`` does. A ``getitem`` read only by a ``clone`` already is not copied
    again, so applying the pass twice (an Edge transform, then `executorch_backend_config`)
    adds nothing; an unused ``getitem`` is not copied.

    Args:
        clone_op: the copy's op. Default: Edge ``aten.clone``, right for
            ``ExecutorchBackendConfig.passes``, which run after the Edge verifier. Applied as an
            Edge transform, the verifier of a program lowered with executorch's default
            ``EdgeCompileConfig`` (dim order on) refuses ``aten.clone``: pass
            ``dim_order_ops._clone_dim_order`` there, or use `copy_control_flow_outputs`,
            which picks the op from the program.

    Works on a ``torch.fx.GraphModule`` (a ``PassBase``): as one of
    ``ExecutorchBackendConfig(passes=[...])`` or of ``EdgeProgramManager.transform([...])``.
    """

    def __init__(self, clone_op: Optional[Any] = None) -> None:
        super().__init__()
        self.clone_op = clone_op

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        clone_op = self.clone_op
        if clone_op is None:
            clone_op = edge_ops().edge.aten.clone.default
        copies = _copy_outputs(graph_module, clone_op)
        logger.debug("copied %d control-flow outputs out of the shared body arena", copies)
        return PassResult(graph_module, copies > 0)


def _copy_outputs(gm: torch.fx.GraphModule, clone_op) -> int:
    """Copy the outputs of the copied targets in `gm` and, recursively, in every body of its
    control flow (bodies reached through the calls, not ``gm.modules()``: a lowered delegate's
    own graphs are not the runtime's to plan). Returns how many copies were inserted."""
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
            if not item.users:
                continue
            if all(_is_copy_of(u, item) for u in item.users):
                for u in item.users:  # already copied: keep the copies before the next call
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
    """The ``executorch.exir.ExecutorchBackendConfig`` to pass to ``to_executorch`` so the
    `.pte` returns what the program computes, folded or not, with executorch 1.5.1.

    Args:
        mutated_buffers: fully qualified names of buffers the program writes (``"counter"``,
            ``"layer.running_mean"``) whose initial values the `.pte` must hold: ExecuTorch
            leaves mutable buffers uninitialised unless ``InitializedMutableBufferPass``
            (executorch/exir/passes/init_mutable_pass.py) names them, so the first call would
            read garbage where eager reads the registered value.
        copy_control_flow_outputs: add `CopyControlFlowOutputs` (executorch issue 21490; PRs
            21494 and 21818). Turn it off only to see the fault, or once executorch ships the fix.
        passes: your own ``ExecutorchBackendConfig.passes``; they run first, then the copy (so
            no pass of yours moves a control-flow output back into the shared arena).
        config: any other ``ExecutorchBackendConfig`` field (``memory_planning_pass``,
            ``extract_delegate_segments`` …), passed unchanged.

    Returns:
        an ``ExecutorchBackendConfig``.

    Raises:
        TypeError: a keyword that is not an ``ExecutorchBackendConfig`` field (from the
            dataclass).

    Remove once executorch fixes issue 21490: `tests/test_executorch_upstream.py`'s strict
    xfails then fail and say so; ``ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(
    mutated_buffers)])`` is then all that is left.
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
    """`CopyControlFlowOutputs` applied to every program of an ``EdgeProgramManager`` that is
    already partitioned and lowered (after ``to_edge_transform_and_lower``), so that a plain
    ``to_executorch()`` of the result needs no config for executorch issue 21490 (PRs 21494,
    21818). For a wrapper that returns the manager to its caller; a caller who calls
    ``to_executorch`` itself passes `executorch_backend_config()` instead (or as well: copies
    are not doubled).

    Apply it after partitioning, not as a ``transform_passes`` entry: a partitioner may take the
    copy into a delegate and drop it there (XNNPACK removes clones,
    ``XNNPACKRemoveCloneOpsTransform``, executorch PR 15884). The copy op is the one the
    program's Edge verifier accepts (``_clone_dim_order`` with dim order on, the default;
    ``aten.clone`` with ``EdgeCompileConfig(_skip_dim_order=True)``).

    Args:
        edge_manager: an ``executorch.exir.EdgeProgramManager``.
        inplace: rewrite `edge_manager`'s own programs and return it (attributes a wrapper set
            on the manager stay); the copy op is the one its verifier accepts, so it is not
            verified again.

    Returns:
        with `inplace`, `edge_manager`; else a new ``EdgeProgramManager``
        (``EdgeProgramManager.transform`` copies; `edge_manager` is unchanged, and attributes
        set on it are not carried over), its programs re-verified by executorch's Edge verifier.

    Remove once executorch fixes issue 21490 (`tests/test_executorch_upstream.py` says when).
    """
    from .dialect import dialect_op

    passes = {name: CopyControlFlowOutputs(dialect_op(edge_manager.exported_program(name), "aten.clone.default"))
              for name in edge_manager.methods}
    if not inplace:
        return edge_manager.transform({name: [p] for name, p in passes.items()})
    for name, copy_pass in passes.items():
        copy_pass(edge_manager.exported_program(name).graph_module)
    return edge_manager


def control_flow_calls(program: ExportedProgram) -> list[str]:
    """Names of the calls of `COPIED_TARGETS` in `program`, its bodies included (a body's by
    path: ``true_graph_0/cond_1``), in graph order: the calls whose outputs executorch 1.5.1 can
    overwrite (issue 21490)."""
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
    """The note `FoldReport.notes` carries when `program` (the folded program) has a
    ``cond``/``map``/``scan``: which config to pass to ``to_executorch``, and why. None without
    such calls."""
    calls = control_flow_calls(program)
    if not calls:
        return None
    shown = ", ".join(calls[:5]) + (f" and {len(calls) - 5} more" if len(calls) > 5 else "")
    return (f"the program has control flow ({shown}): lower it with "
            "`to_executorch(folding.executorch_backend_config())` (mutated buffers' names as its first "
            "argument), which copies each output out of the memory all bodies share; executorch 1.5.1 "
            "otherwise lets a later cond/map/scan overwrite it and the .pte returns wrong numbers without "
            "an error (executorch issue 21490)")
