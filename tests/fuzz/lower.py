"""ExecuTorch lowering, serialisation and runtime helpers for the fuzzer (portable and XNNPACK).

Lowering is `tests/lowering.py`'s (mutated buffers serialised with their initial values,
the caller's program lowered from a private copy, control-flow outputs copied out of the body
arena); what differs here: a .pte runs in a worker process (a kernel that aborts must not end
the campaign).
"""

from __future__ import annotations

from typing import Sequence

import torch

from tests.lowering import (  # noqa: F401 (the fuzzer lowers through these)
    backend_config, edge_pte, lower_pte, private_copy, to_edge_program)


def documented_pte(ep, mutated_buffers: Sequence[str] = ()) -> bytes:
    """`ep` lowered exactly as README's "Lowering a folded program" tells users to (portable
    kernels): ``to_edge_transform_and_lower(ep).to_executorch(
    folding.executorch_backend_config(mutated_buffers))``, on a private copy (`ep` unchanged)."""
    from executorch.exir import to_edge_transform_and_lower

    import folding

    manager = to_edge_transform_and_lower(private_copy(ep))
    return manager.to_executorch(folding.executorch_backend_config(mutated_buffers)).buffer


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
