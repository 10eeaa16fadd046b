"""The stored inputs whose value is the same at every call (`folding/core/unchanging.py`): neither
written back by the signature nor written in place by an op of the graph, a view of it, or a
control-flow body (issue 52). Each program writes a stored tensor and reads it through code the
fold would fold; the folded program must agree with the unfolded one over 3 calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from folding import fold_constants
from folding.core.unchanging import unchanging_before_probes
from tests.fold_checks import assert_same_over_calls, export


class _WrittenUnderNoGrad(nn.Module):
    """``exp(2 w)`` of a parameter (constant-only code) that a ``torch.no_grad()`` block then
    writes: torch 2.14 exports the block as ``wrap_with_set_grad_enabled``, whose body's
    ``mul_`` writes ``w``; `nested`: the block inside another (a body calling a body)."""

    def __init__(self, nested: bool):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(1)))
        self.nested = nested

    def forward(self, x):
        y = x * (self.w * 2.0).exp()
        with torch.no_grad():
            if self.nested:
                with torch.enable_grad():
                    with torch.no_grad():
                        self.w.mul_(0.5)
            else:
                self.w.mul_(0.5)
        return y


@pytest.mark.parametrize("nested", [False, True])
def test_a_parameter_a_no_grad_block_writes_is_not_folded(nested):
    x = torch.randn(4, generator=torch.Generator().manual_seed(2))
    ep = export(_WrittenUnderNoGrad(nested), (x,))
    assert any(n.op == "call_function" and "wrap_with_set_grad_enabled" in str(n.target) for n in ep.graph.nodes)
    assert "p_w" not in unchanging_before_probes(ep)
    result = fold_constants(ep)
    assert_same_over_calls(ep, result.program, (x,))
