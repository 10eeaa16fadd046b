"""A stand-in for the two QNN SDK calls, for QNN's GPU backend only (test tooling).

The QNN tests run on the real HTP backend (qnn/sdk.py). The one backend the real libraries cannot
serve here is QNN GPU: on x86-64, ``libQnnGpu.so`` refuses to start without tuning mode
(``GPU_ERROR_INVALID_ARG: TuningMode must be enabled on x86_64-linux-clang platforms``), and
executorch 1.5.1's ``generate_gpu_compiler_spec`` cannot enable it. For that test the two calls
that need the backend, the op-support query ``QnnManager.IsNodeSupportedByBackend`` and the
context compile ``QnnManager.Compile``, are answered here. Executorch creates every
``QnnManager`` in ``QnnManagerRegistry.get_or_create_qnn_manager``
(executorch/backends/qualcomm/utils/qnn_manager_lifecycle.py); `qnn_sdk_stand_in` patches that
one factory to return a `QnnManagerStandIn`; node visitors, QNN's passes, the partitioner and
preprocess's wrapper building run for real.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Dict, Iterator

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
