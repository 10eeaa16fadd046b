"""A stand-in for the two QNN SDK calls, for machines without the Qualcomm SDK.

Without the Qualcomm SDK (libQnnHtp.so) only two calls cannot run: the op-support query
``QnnManager.IsNodeSupportedByBackend`` and the context compile ``QnnManager.Compile`` in
preprocess. Executorch's Python creates every ``QnnManager`` it uses in one place,
``QnnManagerRegistry.get_or_create_qnn_manager``
(executorch/backends/qualcomm/utils/qnn_manager_lifecycle.py), which both
``get_current_qnn_manager`` (called by partition/qnn_partitioner.py and qnn_preprocess.py) and
``QnnManagerContext`` (entered by the lowering wrappers) go through. `qnn_sdk_stand_in` patches
that one factory to return a `QnnManagerStandIn`; node visitors and their ``define_node``, QNN's
passes, the quantizer, the partitioner and preprocess's wrapper building and I/O check all run
for real.

Executorch's QNN code calls ``setup_qnn_sdk()`` (QnnQuantizer, the manager registry), which
downloads an SDK when ``QNN_SDK_ROOT`` is unset. An empty value means "the caller manages the
SDK" (utils/qnn_sdk_setup.py): no download, and QnnQuantizer falls back to its abstract op-info
tables. `use_no_sdk_download` sets it; call it before executorch first sets up the SDK (it reads
the variable then: creating a quantizer or a QNN manager), e.g. right after the imports.

Used by the ``qnn_sdk_stand_in`` test fixture (tests/qnn/conftest.py), by
``python -m benchmarks --qnn`` (benchmarks/qnn_rows.py) and ``--zoo`` (benchmarks/zoo/), and by
the README's QNN example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from typing import Dict, Iterator, Optional

def real_sdk_root() -> Optional[str]:
    """``QNN_SDK_ROOT`` when it names a directory with a ``lib/`` folder (a real SDK), else None."""
    root = os.environ.get("QNN_SDK_ROOT")
    if root and os.path.isdir(os.path.join(root, "lib")):
        return root
    return None


def use_no_sdk_download() -> None:
    """Set ``QNN_SDK_ROOT=""`` when it is unset, so executorch does not download an SDK."""
    if not os.environ.get("QNN_SDK_ROOT"):
        os.environ["QNN_SDK_ROOT"] = ""


def _qnn_op_types() -> frozenset[str]:
    """Every op type QNN defines, from QNN's own op table (builders/qnn_constants.py)."""
    from executorch.backends.qualcomm.builders import qnn_constants

    return frozenset(
        cls.op_name
        for cls in vars(qnn_constants).values()
        if dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "op_name", None), str)
    )


class QnnManagerStandIn:
    """Stands in for ``PyQnnManagerAdaptor.QnnManager`` where the SDK is needed.

    Op support: an op is supported when QNN's node visitor built it (the partitioner asks only
    after ``define_node`` returned op wrappers) and every wrapper names an op of QNN's op package
    (``qti.aisw``) that QNN's op table defines. The partitioner itself already refuses nodes
    without a visitor, ``not_supported_operator`` and ``skip_node_*``.

    Compile: returns a placeholder context binary (a digest of the graph's op wrappers), so a
    lowered program is deterministic but cannot run on a device.

    Attributes:
        queries: (op types, answer) per support query, in order.
        compiled: per compile, the op types of each graph.
    """

    PLACEHOLDER_PREFIX = b"QNN-SDK-STAND-IN:"

    def __init__(self, backend_type, option: bytes) -> None:
        from executorch.backends.qualcomm.serialization.qc_schema_serialize import flatbuffer_to_option

        self.backend_type = backend_type
        self.options = flatbuffer_to_option(option)
        self.op_types = _qnn_op_types()
        self.queries: list[tuple[tuple[str, ...], bool]] = []
        self.compiled: list[list[list[str]]] = []
        self._graph_names: list[str] = []

    def IsNodeSupportedByBackend(self, op_wrappers) -> bool:  # noqa: N802 (QNN's name)
        from executorch.backends.qualcomm.builders.qnn_constants import QNN_OP_PACKAGE_NAME_QTI_AISW

        types = tuple(w.GetOpType() for w in op_wrappers)
        answer = bool(op_wrappers) and all(
            w.GetPackageName() == QNN_OP_PACKAGE_NAME_QTI_AISW and w.GetOpType() in self.op_types
            for w in op_wrappers
        )
        self.queries.append((types, answer))
        return answer

    def InitContext(self, graph_names) -> None:  # noqa: N802
        self._graph_names = list(graph_names)

    def GetGraphNames(self) -> list[str]:  # noqa: N802
        return list(self._graph_names)

    def IsTensorDump(self) -> bool:  # noqa: N802
        return bool(self.options.dump_intermediate_outputs)

    def Compile(self, graph_names, op_wrapper_lists) -> bytes:  # noqa: N802
        graphs = [[w.GetOpType() for w in wrappers] for wrappers in op_wrapper_lists]
        self.compiled.append(graphs)
        digest = hashlib.sha256(repr((list(graph_names), [[(w.GetName(), w.GetOpType()) for w in ws]
                                                          for ws in op_wrapper_lists])).encode()).hexdigest()
        return self.PLACEHOLDER_PREFIX + digest.encode()

    def DestroyContext(self) -> None:  # noqa: N802
        self._graph_names = []

    def Destroy(self) -> None:  # noqa: N802
        pass


@contextlib.contextmanager
def qnn_sdk_stand_in() -> Iterator[Dict[object, QnnManagerStandIn]]:
    """Replace the QNN manager (the two SDK calls) inside the block.

    Patches ``QnnManagerRegistry.get_or_create_qnn_manager`` so every registry hands out one
    `QnnManagerStandIn` per backend type, and restores the original method on exit (also on an
    exception). Not thread-safe: the patch is on the class.

    Yields:
        {backend_type: stand-in}, filled as lowering creates managers.
    """
    from executorch.backends.qualcomm.utils.qnn_manager_lifecycle import QnnManagerRegistry

    managers: Dict[object, QnnManagerStandIn] = {}
    original = QnnManagerRegistry.__dict__["get_or_create_qnn_manager"]

    def get_or_create_qnn_manager(self, backend_type, option):
        if backend_type not in self._registry:
            self._registry[backend_type] = managers.setdefault(backend_type, QnnManagerStandIn(backend_type, option))
        return self._registry[backend_type]

    QnnManagerRegistry.get_or_create_qnn_manager = get_or_create_qnn_manager
    try:
        yield managers
    finally:
        QnnManagerRegistry.get_or_create_qnn_manager = original
