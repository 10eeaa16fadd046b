"""The premise, on the real HTP backend: executorch 1.5.1's stock flow refuses a program whose
kept-whole op reads only constants, and the same program lowers, compiles, runs on the emulated
HTP and matches eager once the fold stage runs.

Without folding, lowered with executorch's own ``to_edge_transform_and_lower_to_qnn``
(backends/qualcomm/utils/utils.py), whose partitioner has no rule about partitions without a
runtime input: HTP refuses the constant-only partition in preprocess (``No graph inputs present
for graph``, context-binary error 0x7532), or, when HTP's op validation already declines the op
(``scatter_add``: QNN 2.49's ``ScatterElements`` takes reduction NONE only), executorch's check
finds the kept-whole op neither decomposed nor delegated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype
from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn as executorch_lower

import qnn

from .helpers import STRANDED, assert_kept_whole_ops_gone, assert_runs_on_htp, compiler_specs, quantize
from .models import RELU, LinearCutOffByRelu

REFUSALS = ("Failed to generate Qnn context binary", STRANDED)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


class _ConstantBranch(torch.nn.Module):
    """``proj(x) + relu(op(constants))``: the skipped relu cuts the kept-whole op off every
    runtime input."""

    def __init__(self, op: Callable, constants: dict, d: int) -> None:
        super().__init__()
        self.op = op
        for name, value in constants.items():
            self.register_buffer(name, value)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.proj(x) + torch.relu(self.op(self))


def _scatter_index():
    return torch.randint(0, 4, (2, 16), generator=_gen(3))


FLOAT = {
    "linear": lambda: _ConstantBranch(lambda s: F.linear(s.t, s.w), {"t": torch.randn(4, 16, generator=_gen(1)), "w": torch.randn(16, 16, generator=_gen(2)) / 4}, 16),
    "rms_norm": lambda: _ConstantBranch(lambda s: F.rms_norm(s.t, [16], s.g), {"t": torch.randn(4, 16, generator=_gen(1)), "g": torch.rand(16, generator=_gen(2)) + 0.5}, 16),
    "scatter_add": lambda: _ConstantBranch(lambda s: s.t.scatter_add(0, s.i, s.src), {"t": torch.randn(4, 16, generator=_gen(1)), "i": _scatter_index(), "src": torch.randn(2, 16, generator=_gen(4))}, 16),
    "scatter_src": lambda: _ConstantBranch(lambda s: s.t.scatter(0, s.i, s.src), {"t": torch.randn(4, 16, generator=_gen(1)), "i": _scatter_index(), "src": torch.randn(2, 16, generator=_gen(4))}, 16),
    "pixel_unshuffle": lambda: _ConstantBranch(lambda s: F.pixel_unshuffle(s.image, 2).reshape(4, 16), {"image": torch.randn(1, 1, 8, 8, generator=_gen(1))}, 16),
    "matmul": lambda: _ConstantBranch(lambda s: torch.matmul(s.a, s.b), {"a": torch.randn(4, 8, generator=_gen(1)), "b": torch.randn(8, 16, generator=_gen(2)) / 3}, 16),
    "stack": lambda: _ConstantBranch(lambda s: torch.stack([s.a, s.b], 0).reshape(4, 16), {"a": torch.randn(2, 16, generator=_gen(1)), "b": torch.randn(2, 16, generator=_gen(2))}, 16),
}


@dataclass
class _Program:
    reference: torch.nn.Module  # eager (float) or converted q/dq (quantized)
    inputs: tuple
    quantized: bool


def _program(name: str) -> _Program:
    if name in FLOAT:
        return _Program(FLOAT[name]().eval(), (torch.randn(4, 16, generator=_gen(100)),), False)
    inputs = (torch.randn(4, 64, generator=_gen(7)),)
    scheme = {"8a8w_linear": dict(quant_dtype=QuantDtype.use_8a8w),
              "16a4w_block_linear": dict(quant_dtype=QuantDtype.use_16a4w_block,
                                         block_size_map={"linear": (1, 32), "linear_1": (1, 32)})}[name]
    return _Program(quantize(LinearCutOffByRelu().eval(), inputs, **scheme), inputs, True)


CASES = list(FLOAT) + ["8a8w_linear", "16a4w_block_linear"]


@pytest.mark.parametrize("name", CASES)
def test_stock_flow_refuses_and_fold_stage_lowers_compiles_and_runs(name):
    program = _program(name)
    with pytest.raises((RuntimeError, AssertionError)) as refusal:
        executorch_lower(program.reference, program.inputs, compiler_specs(False, quantized=program.quantized),
                         skip_node_op_set={RELU})
    assert any(text in str(refusal.value) for text in REFUSALS), refusal.value
    print(f"{name}: HTP without folding: {type(refusal.value).__name__}: {str(refusal.value)[:200]}")

    manager = qnn.to_edge_transform_and_lower_to_qnn(
        program.reference, program.inputs, compiler_specs(True, quantized=program.quantized), skip_node_op_set={RELU}
    )
    summary = qnn.describe_partitions(manager)
    assert summary.partitions == 1, summary
    assert set(summary.cpu_ops) <= {"aten._to_copy.default"}, summary  # scatter's index casts
    assert_kept_whole_ops_gone(manager)
    assert_runs_on_htp(manager, program.reference, program.inputs, quantized=program.quantized)
