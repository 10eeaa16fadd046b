"""Running the suite's ``.pte`` on the emulated HTP, where the suite would run a device or a binary.

executorch's ``TestQNN.verify_output`` (backends/qualcomm/tests/utils.py) is the one place the
suite executes a lowered program: with ``enable_x86_64`` it writes the inputs as raw files and
runs a built ``qnn_executor_runner`` binary, otherwise it pushes to a device with adb. This
machine has neither, so `verify_output` below takes its place: same signature, same reference
(the suite's ``_save_model_and_expected_output``: eager ``module(*inputs)``), same input
quantization and output decoding as the suite's ``processed_inputs`` / ``post_process``, and the
suite's own ``_assert_outputs_equal``; only the execution differs: `qnn.run_pte`, executorch's
pybindings with QNN 2.49.40's x86-64 ``libQnnHtp.so`` (qnn/runtime.py).

Each ``.pte`` runs in a fresh process, as the suite's runner binary does (`run_in_fresh_process`).
The runtime does not serialize a mutated buffer's initial value (executorch writes it only for
buffers `InitializedMutableBufferPass` names), so such a program reads whatever its planned
memory held. In a fresh process that is zeroed memory; in a process that already ran other
programs it is their garbage. Measured on the suite's ``IndexPut(mode=0)`` (a zero ``k_cache``
mutated by ``index_put_``), stock executorch's own ``.pte``: run twice in one process, 8 of
1,572,864 elements wrong on the second run, and 786,432 wrong after the process had freed
other 6 MiB blocks; run in fresh processes, 0 wrong every time. Run in the worker itself, the
verdict of such a test depended on what the worker had run before, which differs between the
stock and the fold side.

Decoding as the suite does: the runner writes each output tensor's bytes to a ``.raw`` file and
``post_process`` reads them back with ``np.fromfile`` as the reference's dtype (or the output
encoding's dtype), reshaped to the reference's shape, then dequantizes with the encoding. The
outputs are taken in program order (the suite sorts file names, the same order below ten
outputs).

What needs the runner binary or a device, and so raises `NotOnEmulator` (the test is listed as
one the emulator cannot run, not counted as a failure): an op package pushed with the program,
a callback that reads the runner's process output, profiling events or intermediate tensors
from the runner's etdump / debug buffer, the runner's inference-speed or heap files, extra
runner flags, and the adb tool (``get_adb_tool``).
"""

from __future__ import annotations

import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch


class NotOnEmulator(Exception):
    """What the test asks for needs a device or the ``qnn_executor_runner`` binary."""


def _unsupported(op_package_paths, output_callback, expected_profile_events, expected_compared_events,
                 save_inference_speed, save_heap_result, extra_cmds) -> Optional[str]:
    if op_package_paths:
        return "a QNN op package pushed to the device with the program"
    if output_callback is not None:
        return "an output_callback that reads qnn_executor_runner's process output"
    if expected_profile_events != -1:
        return "profiling events from qnn_executor_runner's etdump"
    if expected_compared_events != -1:
        return "intermediate tensors from qnn_executor_runner's debug output"
    if save_inference_speed:
        return "qnn_executor_runner's inference-speed file"
    if save_heap_result:
        return "the device's HTP heap profile"
    if extra_cmds and extra_cmds.strip():
        return f"qnn_executor_runner flags {extra_cmds.strip()!r}"
    return None


_FRESH: Optional[ProcessPoolExecutor] = None


def _run_pte_arrays(buffer: bytes, inputs: Sequence[np.ndarray], method: str) -> List[np.ndarray]:
    """In the child: `qnn.run_pte`, with numpy arrays across the process boundary."""
    import qnn

    return [t.detach().contiguous().numpy().copy() for t in
            qnn.run_pte(buffer, [torch.from_numpy(a) for a in inputs], method)]


def run_in_fresh_process(buffer: bytes, inputs: Sequence[torch.Tensor], method: str) -> List[torch.Tensor]:
    """`qnn.run_pte` in a process of its own that has run no other program.

    The child is forked from a forkserver that has imported torch, executorch's runtime and
    `qnn` and done nothing else, so every ``.pte`` starts from the same memory, as one
    ``qnn_executor_runner`` process per test does (about 0.4 s a run, against 7 s for a new
    interpreter). Raises what `qnn.run_pte` raises (re-raised from the child), and
    ``BrokenProcessPool`` if the child dies.
    """
    global _FRESH
    if _FRESH is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", "executorch.runtime", "qnn"])
        _FRESH = ProcessPoolExecutor(1, mp_context=context, max_tasks_per_child=1)
    arrays = [t.detach().contiguous().numpy() for t in inputs]
    return [torch.from_numpy(a) for a in _FRESH.submit(_run_pte_arrays, bytes(buffer), arrays, method).result()]


def _method_name(executorch_prog, method_index: int) -> str:
    return executorch_prog.executorch_program.execution_plan[method_index].name


def _decode(raw: torch.Tensor, ref: torch.Tensor, enc) -> torch.Tensor:
    """The suite's ``post_process`` for one output, from the tensor instead of its ``.raw`` file."""
    from executorch.backends.qualcomm.utils.constants import QCOM_DTYPE, QCOM_SCALE, QCOM_ZERO_POINT
    from torch.testing._internal.common_utils import torch_to_numpy_dtype_dict

    dtype = ref.numpy().dtype if enc is None else torch_to_numpy_dtype_dict[enc[QCOM_DTYPE]]
    data = raw.detach().contiguous().numpy().tobytes()
    output = torch.from_numpy(np.frombuffer(data, dtype=dtype).copy()).reshape(ref.shape)
    if enc is not None:
        output = output.to(torch.float).sub(enc[QCOM_ZERO_POINT]).mul(enc[QCOM_SCALE])
    return output


def verify_output(  # noqa: C901  (the suite's signature, argument for argument)
    self,
    module: torch.nn.Module,
    sample_inputs: Tuple[torch.Tensor],
    executorch_prog,
    etrecord_path: str = "etrecord.bin",
    expected_profile_events: int = -1,
    method_index: int = 0,
    input_encodings: Tuple = (),
    output_encodings: Tuple = (),
    check_io_shape: bool = False,
    op_package_paths: List[str] = None,
    extra_cmds: str = "",
    output_callback: Optional[Callable[[str], None]] = None,
    save_inference_speed: bool = False,
    expected_compared_events: int = -1,
    qnn_intermediate_debugger=None,
    save_heap_result: bool = False,
):
    """``TestQNN.verify_output`` with the ``.pte`` run by `qnn.run_pte` on the emulated HTP, in a
    fresh process (`run_in_fresh_process`)."""
    from executorch.backends.qualcomm.utils.constants import QCOM_DTYPE, QCOM_SCALE, QCOM_ZERO_POINT

    reason = _unsupported(op_package_paths, output_callback, expected_profile_events, expected_compared_events,
                          save_inference_speed, save_heap_result, extra_cmds)
    if reason:
        raise NotOnEmulator(f"needs {reason}")
    with tempfile.TemporaryDirectory() as tmp_dir:
        ref_outputs, _ = self._save_model_and_expected_output(module, executorch_prog.buffer, sample_inputs, tmp_dir)
    processed_inputs = list(sample_inputs)
    for i, enc in enumerate(input_encodings):
        processed_inputs[i] = (
            processed_inputs[i].div(enc[QCOM_SCALE]).add(enc[QCOM_ZERO_POINT]).round().to(enc[QCOM_DTYPE])
        )
    # the suite's generate_inputs (backends/qualcomm/export_utils.py): one level of list/tuple is
    # written as that many input files, anything not a tensor through torch.tensor
    flat = [x for d in processed_inputs for x in (d if isinstance(d, (list, tuple)) else [d])]
    processed_inputs = [t if isinstance(t, torch.Tensor) else torch.tensor(t) for t in flat]
    raw_outputs = run_in_fresh_process(executorch_prog.buffer, processed_inputs, _method_name(executorch_prog, method_index))
    if check_io_shape:  # qnn_executor_runner's --output_shape_path check
        self.assertEqual([tuple(t.shape) for t in raw_outputs], [tuple(t.shape) for t in ref_outputs])
    outputs = [
        _decode(raw, ref, output_encodings[i] if len(output_encodings) != 0 else None)
        for i, (raw, ref) in enumerate(zip(raw_outputs, ref_outputs))
    ] + list(raw_outputs[len(ref_outputs):])  # a count mismatch fails in _assert_outputs_equal
    self._assert_outputs_equal(outputs, ref_outputs)


def get_adb_tool(self, pte_fname):
    """``TestQNN.get_adb_tool``: the suite's adb wrapper addresses a device; there is none here."""
    raise NotOnEmulator("needs a device (adb: get_adb_tool)")
