"""How every test and the fuzzer lower a program to a .pte and run it (portable kernels or
XNNPACK), in one place.

Each serialisation goes through `backend_config`, which works around executorch issue 21490
(open in executorch 1.5.1; PRs 21494 and 21818 fix it upstream): the emitter hands a ``cond``
branch's outputs to the caller with a ``MoveCall``, a pointer move, so they stay in the memory
arena that every control-flow body shares, and the next ``cond`` overwrites them. Two
``torch.cond`` calls in a row whose first result is read after the second already return a
wrong value, folded or not (`tests/test_executorch_upstream.py` pins it). Which programs hit
it depends on the memory plan, so a fold that changes the bodies can move a program from
right by luck to wrong: a check of the fold must not depend on that luck.

XNNPACK lowering goes through `xnnpack_partitioner`, which works around another executorch
fault the same way (a value returned twice through clones fails XNNPACK's preprocess).
"""

from __future__ import annotations

import copy
import operator
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase, PassResult


def _control_flow_targets() -> tuple:
    """The higher-order ops executorch's emitter lowers into jumps over a shared body arena."""
    return (torch.ops.higher_order.cond, torch.ops.higher_order.map_impl, torch.ops.higher_order.scan)


class CopyControlFlowOutputs(PassBase):
    """Copy every output of a ``cond``/``map``/``scan`` into the caller's memory right after the
    call (an Edge ``aten.clone``), in every graph of the program: the copy is memory-planned in
    the caller, so a later body cannot overwrite it (executorch issue 21490). Each ``getitem``
    moves to right after its call first: delegating a partition can leave a ``getitem`` after
    the next ``cond`` (fuzz case 26000182, XNNPACK). Changes only where values live, not what
    they are."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        from executorch.exir.dialects._ops import ops as exir_ops

        targets = _control_flow_targets()
        changed = False
        for gm in [m for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)]:
            hops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]
            for hop in hops:
                anchor = hop
                for item in [u for u in hop.users if u.target is operator.getitem]:
                    anchor.append(item)  # right after the call: a later node may be another cond
                    anchor = item
                    with gm.graph.inserting_after(item):
                        kept = gm.graph.call_function(exir_ops.edge.aten.clone.default, (item,))
                    kept.meta = dict(item.meta)
                    item.replace_all_uses_with(kept, delete_user_cb=lambda user, kept=kept: user is not kept)
                    anchor = kept
                    changed = True
            if hops:
                gm.recompile()
        return PassResult(graph_module, changed)


def backend_config(mutated_buffers: Sequence[str] = (), *, copy_control_flow_outputs: bool = True):
    """The `ExecutorchBackendConfig` every .pte here is serialised with: control-flow outputs
    copied out of the body arena (`CopyControlFlowOutputs`, off only to show executorch issue
    21490), and the initial values of `mutated_buffers` serialised (by default ExecuTorch leaves
    them uninitialised), so a .pte's first call sees the same state as eager."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    passes: list = [CopyControlFlowOutputs()] if copy_control_flow_outputs else []
    if mutated_buffers:
        passes.append(InitializedMutableBufferPass(list(mutated_buffers)))
    return ExecutorchBackendConfig(passes=passes)


def private_copy(ep: ExportedProgram) -> ExportedProgram:
    """A deep copy of `ep` (lowering passes rewrite what they are given), or `ep` itself when it
    holds tensors that cannot be deep-copied (non-leaf tensors of converted PT2E models)."""
    try:
        return copy.deepcopy(ep)
    except RuntimeError:
        return ep


def to_edge_program(ep: ExportedProgram) -> ExportedProgram:
    """The Edge-dialect program `to_edge` makes of `ep` (default EdgeCompileConfig)."""
    from executorch.exir import to_edge

    return to_edge(ep).exported_program()


def edge_pte(edge_program: ExportedProgram, mutated_buffers: Sequence[str] = (), **config) -> bytes:
    """Serialise an Edge-dialect program to .pte bytes (portable kernels, no partitioner);
    `edge_program` is not changed. `config`: keywords of `backend_config`."""
    from executorch.exir import EdgeProgramManager

    manager = EdgeProgramManager({"forward": private_copy(edge_program)})
    return manager.to_executorch(backend_config(mutated_buffers, **config)).buffer


def lower_pte(ep: ExportedProgram, backend: str = "portable", mutated_buffers: Sequence[str] = (),
              **config) -> bytes:
    """Lower an ATen program for ``portable`` kernels or ``xnnpack`` and serialise it; `ep` is
    not changed. `config`: keywords of `backend_config`."""
    from executorch.exir import to_edge_transform_and_lower

    manager = to_edge_transform_and_lower(private_copy(ep), partitioner=_partitioner(backend))
    return manager.to_executorch(backend_config(mutated_buffers, **config)).buffer


def lower_with_edge(ep: ExportedProgram, backend: str = "portable") -> tuple[bytes, ExportedProgram]:
    """`lower_pte`, and the Edge program the .pte was made from (before serialisation)."""
    from executorch.exir import to_edge_transform_and_lower

    manager = to_edge_transform_and_lower(private_copy(ep), partitioner=_partitioner(backend))
    edge_program = copy.deepcopy(manager.exported_program())
    return manager.to_executorch(backend_config()).buffer, edge_program


def _partitioner(backend: str) -> Optional[list]:
    if backend == "portable":
        return None
    if backend == "xnnpack":
        return [xnnpack_partitioner()]
    raise ValueError(f"unknown backend {backend!r}: portable or xnnpack")


def xnnpack_partitioner():
    """``XnnpackPartitioner`` without its clone configs (``CloneConfig``, ``CloneDimOrderConfig``):
    clones run on portable kernels.

    Works around an XNNPACK fault in executorch 1.5.1 (pinned in
    `tests/test_executorch_upstream.py`): a value returned both as itself and as a clone
    (``return c, c.clone()``, or two clones) fails to lower. ``XNNPACKRemoveCloneOpsTransform``
    removes the clones inside the delegate, so the delegate returns ``c`` twice, and
    ``xnnpack_preprocess.generate_node_to_external_map`` rejects a repeated output ("Output node
    ... is already in the inputs"). Inlining a ``cond`` brings such clones out of a branch, where
    XNNPACK never saw them, to the top level, folded or not."""
    from executorch.backends.xnnpack.partition.config import (
        ALL_PARTITIONER_CONFIGS, CloneConfig, CloneDimOrderConfig)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner(configs=[c for c in ALL_PARTITIONER_CONFIGS
                                       if c not in (CloneConfig, CloneDimOrderConfig)])


def run_pte(buffer: bytes, inputs: Sequence) -> list[torch.Tensor]:
    """Load a .pte in the ExecuTorch runtime (this process) and run ``forward`` once."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return list(_load_for_executorch_from_buffer(buffer).forward(tuple(inputs)))
