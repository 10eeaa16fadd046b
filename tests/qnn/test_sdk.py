"""Finding, opening and checking the QNN HTP libraries (qnn/sdk.py). Cases that change the
process (another ``QNN_SDK_ROOT``, a crash) run in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import qnn
from qnn import sdk


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=Path(__file__).resolve().parents[2], timeout=600)


def test_the_loaded_libraries_are_qnn_2_49_in_an_sdk_shaped_root(qnn_sdk):
    assert qnn_sdk.build_id.startswith(sdk.SUPPORTED_BUILD_PREFIX)
    root = Path(qnn_sdk.root)
    for name in ("libQnnHtp.so", "libQnnSystem.so"):
        assert (root / "lib" / "x86_64-linux-clang" / name).resolve() in {
            Path(qnn_sdk.htp_library), Path(qnn_sdk.system_library)}
    assert os.environ["QNN_SDK_ROOT"] == qnn_sdk.root
    assert qnn.load_qnn_sdk() is qnn_sdk  # once per process


def test_an_sdk_root_without_the_libraries_or_with_another_library_raises_a_typed_error(tmp_path, qnn_sdk):
    """Two roots in turn, in one fresh interpreter (a failed load is not kept): one without the
    libraries, one whose ``libQnnHtp.so`` is another library (no ``QnnInterface_getProviders``)."""
    empty, other = tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    lib = other / "lib" / "x86_64-linux-clang"
    lib.mkdir(parents=True)
    shutil.copy(Path(qnn_sdk.system_library), lib / "libQnnSystem.so")
    shutil.copy(Path(qnn_sdk.system_library), lib / "libQnnHtp.so")
    (other / "lib" / "onnxruntime_qnn.libs").symlink_to(Path(qnn_sdk.system_library).parent.parent / "onnxruntime_qnn.libs")
    code = ("import os, qnn\n"
            "for root in (%r, %r):\n"
            "    os.environ['QNN_SDK_ROOT'] = root\n"
            "    try:\n"
            "        qnn.load_qnn_sdk()\n"
            "        print('LOADED')\n"
            "    except qnn.QnnSdkError as e:\n"
            "        print('QnnSdkError:', str(e).replace(chr(10), ' '))\n") % (str(empty), str(other))
    out = _python(code)
    assert out.returncode == 0, out.stderr
    missing, wrong = [line for line in out.stdout.splitlines() if line.startswith(("QnnSdkError:", "LOADED"))]
    assert "QnnSdkError:" in missing and "libQnnHtp.so" in missing and "onnxruntime-qnn==2.5.0" in missing
    assert "QnnSdkError:" in wrong and "not a QNN backend library" in wrong


def test_gcc_built_extensions_still_unwind_after_a_qnn_lowering():
    """The QNN wheel's libc++abi must not take over ``__gxx_personality_v0``: matplotlib's
    pybind11 modules throw C++ exceptions while importing, which crashed the process."""
    code = """
import torch, qnn
from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
from executorch.backends.qualcomm.utils.utils import generate_htp_compiler_spec
specs = qnn.generate_qnn_executorch_compiler_spec(QcomChipset.SM8650, generate_htp_compiler_spec(use_fp16=True))
edge = qnn.to_edge_transform_and_lower_to_qnn(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),), specs)
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
print("imported")
"""
    out = _python(code)
    assert out.returncode == 0 and "imported" in out.stdout, (out.returncode, out.stderr[-2000:])
