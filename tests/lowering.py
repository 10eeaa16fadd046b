"""How the folding tests and the fuzzer lower a program to a .pte and run it (portable kernels
or XNNPACK), in one place, with the product's workarounds (`folding/lowering/control_flow_outputs.py`, `folding/lowering/xnnpack.py`).
Three kinds of test lower their own way, because the lowering is what they test: the QNN tests
(`qnn.lowering`, `tests/qnn/helpers.py`), `FoldConstantsPass` inside executorch's
`to_edge_transform_and_lower` (`tests/test_api.py`), and executorch's own flow with and without
the workarounds (`tests/test_executorch_upstream.py`).

Each serialisation goes through `backend_config` (`folding.executorch_backend_config`), which
works around executorch issue 21490
(open in executorch 1.5.1; PRs 21494 and 21818 fix it upstream): the emitter hands a ``cond``
branch's outputs to the caller with a ``MoveCall``, a pointer move, so they stay in the memory
arena that every control-flow body shares, and the next ``cond`` overwrites them. Two
``torch.cond`` calls in a row whose first result is read after the second already return a
wrong value, folded or not (`tests/test_executorch_upstream.py` pins it). Which programs hit
it depends on the memory plan, so a fold that changes the bodies can move a program from
right by luck to wrong: a check of the fold must not depend on that luck.

XNNPACK lowering goes through `folding.xnnpack_partitioner`, which works around another
executorch fault the same way (a value returned twice through clones fails XNNPACK's preprocess).

One function lowers without those workarounds, on purpose: `stock_lower_pte`, for the rule that
folding never makes a program that lowers with executorch's defaults fail to lower
(tests/test_lowerable.py and the control-flow checks).
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram

# The product's workarounds (folding/lowering/control_flow_outputs.py), re-exported: tests and the fuzzer lower
# through exactly what users are told to use.
from folding.lowering.control_flow_outputs import CopyControlFlowOutputs, executorch_backend_config  # noqa: F401
from folding.lowering.xnnpack import xnnpack_partitioner  # noqa: F401


def backend_config(mutated_buffers: Sequence[str] = (), *, copy_control_flow_outputs: bool = True):
    """The `ExecutorchBackendConfig` every .pte here is serialised with: the product's,
    `folding.executorch_backend_config` (control-flow outputs copied out of the body arena, off
    only to show executorch issue 21490; the initial values of `mutated_buffers` serialised), so
    the tests lower the way users are told to."""
    return executorch_backend_config(mutated_buffers, copy_control_flow_outputs=copy_control_flow_outputs)


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


def stock_lower_pte(ep: ExportedProgram, backend: str, transform_passes=()) -> bytes:
    """The .pte of `ep` through executorch's own ``to_edge_transform_and_lower`` with
    `transform_passes`, for the portable runtime or XNNPACK (a plain ``XnnpackPartitioner``),
    serialised with executorch's default config: none of this module's workarounds. `ep` is
    lowered as given (pass a copy to keep it)."""
    from executorch.exir import to_edge_transform_and_lower

    partitioner = None
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    manager = to_edge_transform_and_lower(ep, transform_passes=list(transform_passes), partitioner=partitioner)
    return manager.to_executorch().buffer


def _partitioner(backend: str) -> Optional[list]:
    if backend == "portable":
        return None
    if backend == "xnnpack":
        return [xnnpack_partitioner()]
    raise ValueError(f"unknown backend {backend!r}: portable or xnnpack")


def run_pte(buffer: bytes, inputs: Sequence) -> list[torch.Tensor]:
    """Load a .pte in the ExecuTorch runtime (this process) and run ``forward`` once."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    return list(_load_for_executorch_from_buffer(buffer).forward(tuple(inputs)))
