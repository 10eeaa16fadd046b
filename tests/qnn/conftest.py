"""The QNN SDK stand-in fixture (the only test double under tests/qnn) and the ``qnn_sdk`` marker.

Without the Qualcomm SDK (libQnnHtp.so) only two calls cannot run: the op-support query
``QnnManager.IsNodeSupportedByBackend`` and the context compile ``QnnManager.Compile`` in
preprocess. The `qnn_sdk_stand_in` fixture replaces exactly these for one test with
`qnn.testing.sdk_stand_in.qnn_sdk_stand_in` (which patches
``QnnManagerRegistry.get_or_create_qnn_manager`` to return a
`qnn.testing.sdk_stand_in.QnnManagerStandIn`; see that module for the support rule); node
visitors and their ``define_node``, QNN's passes, the quantizer, the partitioner and
preprocess's wrapper building and I/O check all run for real. ``python -m benchmarks --qnn``
uses the same stand-in.

Tests marked ``qnn_sdk`` need the real SDK and are skipped when ``QNN_SDK_ROOT`` is unset.
"""

from __future__ import annotations

import os

import pytest

_SDK_ROOT = os.environ.get("QNN_SDK_ROOT")

# Executorch's QNN code calls setup_qnn_sdk() (QnnQuantizer, the manager registry), which
# downloads an SDK when QNN_SDK_ROOT is unset. An empty value means "the caller manages the
# SDK" (utils/qnn_sdk_setup.py): no download, and QnnQuantizer falls back to its abstract
# op-info tables. Set before any test imports executorch's QNN modules.
if not _SDK_ROOT:
    os.environ["QNN_SDK_ROOT"] = ""


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("qnn_sdk") and not _SDK_ROOT:
        pytest.skip("needs the real Qualcomm QNN SDK (libQnnHtp.so): QNN_SDK_ROOT is unset")


@pytest.fixture
def qnn_sdk_stand_in():
    """Replace the QNN manager (the two SDK calls) for one test; yields {backend_type: stand-in}."""
    from qnn.testing.sdk_stand_in import qnn_sdk_stand_in as stand_in

    with stand_in() as managers:
        yield managers
