"""`pass_manager_cls`: QNN's pass manager with the control-flow-aware passes of `qnn._passes`
in the export, annotation and to-edge pipelines, and `with_control_flow_passes` for a caller's
``passes_job``/``dep_table``. The one place the project chooses QNN's passes: `qnn.lowering`
(``_pass_factory``) and `qnn.partitioner` (``default_to_edge_passes``) build the to-edge passes
from `pass_manager_cls`, never from executorch's pass manager directly
(tests/test_architecture.py). executorch's pass manager and passes live in a private module
(backends/qualcomm/_passes/), imported through `qnn.executorch_internals`; the classmethods
overridden here are listed there (``OVERRIDDEN_METHODS``)."""

from __future__ import annotations

import functools
from typing import Optional

from executorch.backends.qualcomm.serialization.qc_schema import QnnExecuTorchBackendType

from ._passes import I64toI32SkippingBodies, LiftScalarOperandsSkippingControlFlow
from .executorch_internals import I64toI32, LiftConstantScalarOperands, QnnPassManager, get_qnn_pass_manager_cls

_VARIANTS = {LiftConstantScalarOperands: LiftScalarOperandsSkippingControlFlow, I64toI32: I64toI32SkippingBodies}


def _swap(p):
    return _VARIANTS.get(p, p)


def with_control_flow_passes(table: Optional[dict]) -> Optional[dict]:
    """A caller's ``passes_job`` or ``dep_table`` (keyed by QNN pass classes, as
    ``get_capture_program_passes()`` gives it) with the control-flow variants in place of the
    passes they replace; None stays None."""
    if table is None:
        return None
    out = type(table)()
    for k, v in table.items():
        out[_swap(k)] = [_swap(x) for x in v] if isinstance(v, list) else v
    return out


@functools.cache
def pass_manager_cls(
    backend_type: QnnExecuTorchBackendType = QnnExecuTorchBackendType.kHtpBackend,
) -> type[QnnPassManager]:
    """executorch's QNN pass manager for `backend_type` (``get_qnn_pass_manager_cls`` in
    backends/qualcomm/_passes/qnn_pass_manager.py) with the two passes that crash on control
    flow replaced by `LiftScalarOperandsSkippingControlFlow` and `I64toI32SkippingBodies`, in
    the export, annotation and to-edge pipelines and in the to-edge passes' ordering table.
    Everything else is executorch's. Use it where you would use ``QnnPassManager``, e.g.
    ``qnn.pass_manager_cls()().transform_for_export_pipeline(ep)``."""
    base = get_qnn_pass_manager_cls(backend_type)

    class ControlFlowAwareQnnPassManager(base):
        @classmethod
        def get_export_passes(cls):
            return [_swap(p) for p in super().get_export_passes()]

        @classmethod
        def get_annotation_passes(cls):
            return [_swap(p) for p in super().get_annotation_passes()]

        @classmethod
        def get_default_pass_activations(cls):
            return [(_swap(p), on) for p, on in super().get_default_pass_activations()]

        @classmethod
        def get_passes_dependency_for_capture_program(cls):
            table = super().get_passes_dependency_for_capture_program()
            return {_swap(k): [_swap(v) for v in vs] for k, vs in table.items()}

    ControlFlowAwareQnnPassManager.__qualname__ = f"ControlFlowAware{base.__name__}"
    return ControlFlowAwareQnnPassManager
