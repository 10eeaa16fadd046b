"""Running a QNN ``.pte`` on this machine.

executorch 1.5.1's public runtime API (``executorch.runtime.Runtime``, over the pybindings,
which register ``QnnBackend``); on x86-64 Linux its ``libQnnHtp.so`` (QNN 2.49.40, qnn/sdk.py) executes HTP
context binaries in emulation, so a ``.pte`` lowered for HTP runs here as it would on a device
(fp16 arithmetic and fixed-point kernels included).
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .sdk import load_qnn_sdk


def run_pte(buffer: bytes, inputs: Sequence[torch.Tensor], method: str = "forward") -> List[torch.Tensor]:
    """Load a ``.pte`` (bytes) in the ExecuTorch runtime and run `method` on `inputs`.

    Returns:
        The method's outputs, as tensors.

    Raises:
        QnnSdkError: the QNN libraries are missing or unusable (`load_qnn_sdk`).
        RuntimeError: the runtime refuses the program (executorch's message).
    """
    load_qnn_sdk()
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(bytes(buffer))  # the Program keeps its bytes alive
    loaded = program.load_method(method)
    if loaded is None:
        raise RuntimeError(f"the program has no method {method!r}; it has {sorted(program.method_names)}")
    return list(loaded.execute(tuple(inputs)))
