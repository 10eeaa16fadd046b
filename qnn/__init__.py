"""QNN/HTP integration of the fold stage (executorch 1.5.1's Qualcomm backend).

    import qnn
    specs = qnn.generate_qnn_executorch_compiler_spec(soc, backend_options, fold_constants=True)
    edge = qnn.to_edge_transform_and_lower_to_qnn(model, inputs, specs)
    reports = qnn.qnn_partitioners(edge)["forward"].fold_reports
    # or, in the stock flow:
    # to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[qnn.QnnPartitioner(specs)])
"""

from .sdk import QnnSdk, load_qnn_sdk, prevent_sdk_download, try_load_qnn_sdk

# No file, no library: only QNN_SDK_ROOT="" when unset, so executorch's QNN code (imported below,
# and run by generate_qnn_executorch_compiler_spec or QnnQuantizer before any lowering) never
# downloads an SDK. The libraries are set up at the first QNN use (qnn/sdk.py, load_qnn_sdk).
prevent_sdk_download()

from .pass_manager import pass_manager_cls
from .compile_spec import (FOLD_CONSTANTS_KEY, FoldSpec, generate_qnn_executorch_compiler_spec, split_compile_specs,
                           with_fold_constants)
from .errors import CompileSpecError, ControlFlowNotSupportedError, EncodingLostError, QnnFoldingError, QnnSdkError
from .lowering import PartitionSummary, describe_partitions, qnn_partitioners, to_edge_transform_and_lower_to_qnn
from .partitioner import QnnPartitioner, kept_whole_ops
from .report import PartitionRecord, QnnPartitionReport
from .recipes import export_recipe
from .runtime import run_pte

__all__ = [
    "FOLD_CONSTANTS_KEY",
    "CompileSpecError",
    "ControlFlowNotSupportedError",
    "EncodingLostError",
    "FoldSpec",
    "PartitionRecord",
    "PartitionSummary",
    "QnnFoldingError",
    "QnnPartitionReport",
    "QnnPartitioner",
    "QnnSdk",
    "QnnSdkError",
    "describe_partitions",
    "export_recipe",
    "generate_qnn_executorch_compiler_spec",
    "kept_whole_ops",
    "load_qnn_sdk",
    "pass_manager_cls",
    "prevent_sdk_download",
    "qnn_partitioners",
    "run_pte",
    "try_load_qnn_sdk",
    "split_compile_specs",
    "to_edge_transform_and_lower_to_qnn",
    "with_fold_constants",
]
