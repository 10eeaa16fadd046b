"""QNN tests run on the real Qualcomm HTP backend (QNN 2.49.40 from ``onnxruntime-qnn==2.5.0``).

``qnn.load_qnn_sdk`` finds and opens the libraries at their first use (``import qnn`` opens
none: it only sets ``QNN_SDK_ROOT`` so that executorch downloads no SDK); this session fixture opens
them before any QNN test, and it must succeed: a machine without them fails every QNN test with
`qnn.QnnSdkError` saying what to install, rather than skipping them.
"""

from __future__ import annotations

import pytest

import qnn


@pytest.fixture(scope="session", autouse=True)
def qnn_sdk() -> "qnn.QnnSdk":
    """The QNN libraries the tests use (real op validation, context compiles, emulated HTP)."""
    return qnn.load_qnn_sdk()


@pytest.fixture
def qnn_gpu_stand_in():
    """The SDK stand-in (tests/qnn/sdk_stand_in.py) for QNN's GPU backend only: on x86-64,
    ``libQnnGpu.so`` refuses to start without tuning mode (``GPU_ERROR_INVALID_ARG: TuningMode
    must be enabled on x86_64-linux-clang platforms``), which executorch 1.5.1's
    ``generate_gpu_compiler_spec`` cannot set."""
    from .sdk_stand_in import qnn_sdk_stand_in

    with qnn_sdk_stand_in() as managers:
        yield managers
