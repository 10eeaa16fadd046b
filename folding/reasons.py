"""`Reason`: why a node was folded or kept. Analysis, plan, evaluation and the report share it."""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    """Why a call_function node was not folded (or, for FOLDED/CHECKED, what happened to it)."""

    FOLDED = "folded into a lifted constant or into another folded value"
    CHECKED = "assertion evaluated at fold time on constant inputs and dropped"
    INLINED = "cond with a constant predicate, replaced by the branch it takes"
    BRANCH_NOT_TAKEN = "in the branch a constant predicate does not take (removed with its cond)"
    RUNTIME_INPUT = "reads a runtime input"
    READS_MUTATED_BUFFER = "reads a buffer the program mutates"
    DEPENDS_ON_KEPT = "reads a constant-only value that is kept for another reason"
    RANDOM = "random op (draws from the RNG at runtime)"
    EFFECTFUL = "op with side effects"
    CONTROL_FLOW = "higher-order op (control flow or delegate call)"
    SYMBOLIC = "symbolic shape or argument"
    SKIPPED_TARGET = "target is in FoldPolicy.skip_targets"
    MEMORY_OP = "executorch memory-planning op"
    NOT_A_TENSOR = "result is not a tensor"
    EVALUATION_ERROR = "raised when evaluated at fold time"
    MUTATED_AFTER_RUNTIME_READ = "in-place update of a value that runtime ops read earlier"
    MUTATED_BY_RUNTIME_OP = "value is updated in place by an op that runs at runtime"
    KEEPS_ENCODING = "dequantize of a constant kept so the backend reads its encoding"
    AFTER_DEQUANTIZE = "view, copy or cast of a kept dequantize (folding it would store the dequantized weight as floats)"
    OUTPUT_COPY = "copy of a stored constant returned as an output (ExecuTorch cannot return a stored buffer)"
    FILL_OF_RUNTIME_SHAPE = "fill shaped like a runtime tensor, read only by runtime ops (storing it would only save a fill)"
    LAYOUT_OBSERVED = "a runtime op observes its strides (random `_like` op, as_strided); a stored constant is contiguous"
    MAX_TENSOR_BYTES = "its value is larger than FoldPolicy.max_tensor_bytes"
    GROWTH_BUDGET = "storing it would exceed the program's constant growth budget"
    FUSED = "batch norm or constant scale or shift folded into the weight and bias of the conv or linear it reads"
    SCALE_AND_SHIFT = "eval-mode batch norm rewritten as a per-channel multiply and add by folded constants"
    NOT_FUSED = "batch norm or constant scale or shift after a weight op left as it is (the detail says why)"

    @property
    def constant_only(self) -> bool:
        """True when the node was kept although it reads only constants. A fill shaped like a
        runtime tensor (`FILL_OF_RUNTIME_SHAPE`) reads that tensor at runtime, so it is not."""
        return self not in _NOT_CONSTANT_ONLY_KEPT


_REMOVED = frozenset({Reason.FOLDED, Reason.CHECKED, Reason.INLINED, Reason.BRANCH_NOT_TAKEN, Reason.FUSED,
                      Reason.SCALE_AND_SHIFT})
# NOT_FUSED: the weight-fusion rewrite's row for an op that reads the output of a conv or linear
_NOT_CONSTANT_ONLY_KEPT = _REMOVED | {Reason.RUNTIME_INPUT, Reason.FILL_OF_RUNTIME_SHAPE, Reason.NOT_FUSED}


def removes_node(reason: Reason) -> bool:
    """True when the node is no longer in the folded program (folded, checked, inlined)."""
    return reason in _REMOVED
