"""Constant folding for ExecuTorch programs.

Folds every constant-only subgraph of an ``ExportedProgram`` into lifted constants before
partitioning, so no backend partition is left reading only weights and buffers.

    from folding import fold_constants
    result = fold_constants(exported_program)
    result.program, result.report
"""

import importlib

from .errors import FoldingError, FoldInternalError, FoldInvariantError, InvalidProgramError, PolicyError

# Everything else is imported on first use (PEP 562), so ``python -m folding`` can check its
# command line before torch is imported.
_LAZY = {
    "CopyControlFlowOutputs": ".lowering.control_flow_outputs",
    "Decision": ".report",
    "FoldConstantsPass": ".passes",
    "FoldPolicy": ".policy",
    "FoldReport": ".report",
    "FoldResult": ".fold",
    "LiftedConstant": ".report",
    "Reason": ".reasons",
    "copy_control_flow_outputs": ".lowering.control_flow_outputs",
    "executorch_backend_config": ".lowering.control_flow_outputs",
    "fold_constants": ".fold",
    "reserve_node_names": ".core.names",
    "xnnpack_partitioner": ".lowering.xnnpack",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'folding' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CopyControlFlowOutputs",
    "Decision",
    "FoldConstantsPass",
    "FoldInternalError",
    "FoldInvariantError",
    "FoldPolicy",
    "FoldReport",
    "FoldResult",
    "FoldingError",
    "InvalidProgramError",
    "LiftedConstant",
    "PolicyError",
    "Reason",
    "copy_control_flow_outputs",
    "executorch_backend_config",
    "fold_constants",
    "reserve_node_names",
    "xnnpack_partitioner",
]
