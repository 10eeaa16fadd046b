"""ExecuTorch lowering, serialisation and runtime helpers for the fuzzer (portable and XNNPACK).

What differs from `tests/invariants.py`: mutated buffers are serialised with their initial
values, the caller's program is lowered from a private copy, and a .pte runs in a worker
process (a kernel that aborts must not end the campaign).
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from torch.export import ExportedProgram


def backend_config(mutated_buffers: Sequence[str]):
    """Serialise the initial value of mutated buffers (by default ExecuTorch leaves them
    uninitialised), so a .pte's first call sees the same state as eager."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    if not mutated_buffers:
        return None
    return ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(list(mutated_buffers))])


def private_copy(ep: ExportedProgram) -> ExportedProgram:
    """A deep copy of `ep` (lowering passes may rewrite what they are given), or `ep` itself
    when it holds tensors that cannot be deep-copied (non-leaf tensors of converted PT2E models)."""
    try:
        return copy.deepcopy(ep)
    except RuntimeError:
        return ep


def to_edge_program(ep: ExportedProgram) -> ExportedProgram:
    """The Edge-dialect program `to_edge` makes of `ep` (default config)."""
    from executorch.exir import to_edge

    return to_edge(ep).exported_program()


def edge_pte(edge_program: ExportedProgram, mutated_buffers: Sequence[str] = ()) -> bytes:
    """Serialise an Edge program (portable kernels, no partitioner); `edge_program` is not changed."""
    from executorch.exir import EdgeProgramManager

    manager = EdgeProgramManager({"forward": private_copy(edge_program)})
    return manager.to_executorch(backend_config(mutated_buffers)).buffer


def lower_pte(ep: ExportedProgram, backend: str, mutated_buffers: Sequence[str] = ()) -> bytes:
    """Lower an ATen program for ``portable`` or ``xnnpack`` and serialise it; `ep` is not changed."""
    from executorch.exir import to_edge_transform_and_lower

    partitioner = None
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    manager = to_edge_transform_and_lower(private_copy(ep), partitioner=partitioner)
    return manager.to_executorch(backend_config(mutated_buffers)).buffer


class RuntimeAborted(RuntimeError):
    """The ExecuTorch runtime aborted the process that ran a .pte (an ET_CHECK in a kernel)."""


_WORKER = None


def run_pte(buffer: bytes, calls: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Load a .pte once and call ``forward`` on each input tuple in turn (state carries over).

    Runs in a worker process (`pte_worker`): a generated program can make a runtime kernel
    abort the process (``Fatal Python error: Aborted``), which would otherwise end the whole
    campaign, or the test session running it. A worker that died is replaced.

    Raises:
        RuntimeAborted: the runtime killed its process.
        RuntimeError: loading or running the .pte failed (the message says how).
    """
    global _WORKER
    import subprocess
    import sys

    from .pte_worker import read_message, write_message

    if _WORKER is None or _WORKER.poll() is not None:
        _WORKER = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.pte_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
    try:
        write_message(_WORKER.stdin, (buffer, [tuple(c) for c in calls]))
        reply = read_message(_WORKER.stdout)
    except (BrokenPipeError, OSError):
        reply = None
    if reply is None:
        _WORKER = None
        raise RuntimeAborted("the ExecuTorch runtime aborted while running the .pte")
    status, payload = reply
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def constant_bytes(buffer: bytes) -> int:
    """Bytes of the constant data a .pte stores (`tests.invariants.pte_constant_bytes`)."""
    from tests.invariants import pte_constant_bytes

    return pte_constant_bytes(buffer)
