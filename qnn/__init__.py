"""QNN/HTP integration of the fold stage (executorch 1.5.1's Qualcomm backend).

    import qnn
    specs = qnn.generate_qnn_executorch_compiler_spec(soc, backend_options, fold_constants=True)
    edge = qnn.to_edge_transform_and_lower_to_qnn(model, inputs, specs)
    # or, in the stock flow:
    # to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[qnn.QnnPartitioner(specs)])
"""

from .compile_spec import FOLD_CONSTANTS_KEY, FoldSpec, generate_qnn_executorch_compiler_spec, split_compile_specs
from .errors import CompileSpecError, ControlFlowNotSupportedError, EncodingLostError, QnnFoldingError
from .lowering import PartitionSummary, describe_partitions, to_edge_transform_and_lower_to_qnn
from .partitioner import QnnPartitioner, kept_whole_ops
from .report import PartitionRecord, QnnPartitionReport

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
    "describe_partitions",
    "generate_qnn_executorch_compiler_spec",
    "kept_whole_ops",
    "split_compile_specs",
    "to_edge_transform_and_lower_to_qnn",
]
