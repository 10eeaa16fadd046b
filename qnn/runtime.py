"""Running a QNN ``.pte`` on this machine.

executorch 1.5.1's pybindings (``executorch.extension.pybindings.portable_lib``) register
``QnnBackend``; on x86-64 Linux its ``libQnnHtp.so`` (QNN 2.49.40, qnn/sdk.py) executes HTP
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
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    module = _load_for_executorch_from_buffer(buffer)  # reads `buffer` while it runs: keep it alive
    outputs = module.run_method(method, tuple(inputs))
    return [out for out in outputs]
