"""Campaign cases whose .pte executorch or XNNPACK got wrong, folded or not
(`tests/test_executorch_upstream.py` pins each fault): with the workarounds every .pte here is
lowered with (`tests/lowering.py`, the product's `folding.executorch_backend_config` and
`folding.xnnpack_partitioner`), and XNNPACK's extreme-value kernels excused where they read a
non-finite value (`tests/fuzz/extremes.py`), each case passes every check, .pte included."""

from __future__ import annotations

import pytest
import torch

from tests.fuzz import Options, check, generate
from tests.fuzz.generate import CONTROL_FLOW, pinned


@pytest.mark.slow
def test_control_flow_case_whose_pte_executorch_got_wrong_passes():
    """Control-flow campaign seed 11, case 11000257 (`python -m tests.fuzz --control-flow --case
    11000257`): its folded portable .pte returned another cond's value, executorch issue 21490
    (`tests/test_executorch_upstream.py`); every .pte is now lowered with that worked around.
    Slow tier (about 16 s): the default tier lowers the case shrunk, folded and not, with the
    workaround (`test_executorch_upstream.py`'s ConstantTwiceConds)."""
    outcome = check(generate(11000257, pinned(CONTROL_FLOW)), Options(pte=True))
    assert outcome.status == "ok", (outcome.kind, outcome.message)


def test_control_flow_case_whose_xnnpack_pte_left_a_cond_output_to_the_next_cond_passes():
    """Control-flow campaign seed 26, case 26000182: XNNPACK's delegation left the first cond's
    getitem after the second cond, past the copy that works around executorch issue 21490; the
    copy now moves each getitem right after its call (`tests.lowering.CopyControlFlowOutputs`)."""
    outcome = check(generate(26000182, pinned(CONTROL_FLOW)), Options(pte=True))
    assert outcome.status == "ok", (outcome.kind, outcome.message)


# 23000294 in the slow tier (about 13 s): the default tier lowers its fault shrunk, a value
# returned through two clones, folded and not, with the workaround (`test_executorch_upstream.py`,
# test_keeping_clones_off_xnnpack_lowers_folded_and_unfolded_programs). 23000074 stays: it is
# the one case whose XNNPACK output the excuse of `tests/fuzz/extremes.py` has to cover.
@pytest.mark.parametrize("seed", [23000074, pytest.param(23000294, marks=pytest.mark.slow)])
def test_control_flow_cases_where_inlining_handed_xnnpack_its_own_faults_pass(seed):
    """Control-flow campaign seed 23 (`python -m tests.fuzz --control-flow --case SEED`): inlining a
    constant-predicate cond gave XNNPACK code the unfolded program ran on portable kernels in the
    branch. 23000074: ``sqrt`` of an inf (from a ``-inf`` mask added into a buffer) is NaN on
    XNNPACK; 23000294: a value returned through two clones fails XNNPACK's preprocess. Both are
    XNNPACK's, without folding (`tests/test_executorch_upstream.py`)."""
    outcome = check(generate(seed, pinned(CONTROL_FLOW)), Options(pte=True))
    assert outcome.status == "ok", (outcome.kind, outcome.message)
    if seed == 23000074:
        assert any("aten.sqrt.default reads a non-finite value" in n for n in outcome.notes), outcome.notes


class _CrossedPartitions(torch.nn.Module):
    """Issue 62, item 6, minimised from `families.kept_random`'s shape: a runtime value read by a
    ``stack`` (then ``sum``, not an XNNPACK op) and by a ``cat`` with a parameter that a
    ``linear`` reads as its weight. No fold: the weights are parameters, as a fold makes
    ``w1.tanh()`` a lifted constant (docs/fuzzing.md, "XNNPACK's partition cycles")."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(62)
        self.w0 = torch.nn.Parameter(torch.randn(4, 4, generator=g))
        self.w1 = torch.nn.Parameter(torch.randn(4, 4, generator=g))

    def forward(self, x):
        v1 = torch.nn.functional.relu(x)
        v2 = torch.stack([v1, self.w0]).sum(0)
        v4 = torch.cat([self.w1, v1], 0)[:4]
        return v4, torch.nn.functional.linear(v2, self.w1)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="executorch 1.5.1: GroupBasedPartitioner._merge_partitions merges two partitions that "
                          "read each other (each acyclic alone): 'Invalid partition, found dependency cycles'")
def test_xnnpack_lowers_two_partitions_that_read_each_other_without_folding():
    """Upstream, without folding: XNNPACK's partitioner fails on this graph of parameters, with
    executorch's own `XnnpackPartitioner`. The fuzzer's `kept_random` programs meet it once the fold
    has made their computed weights static; a strict xfail, so a fixed executorch shows here."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(_CrossedPartitions().eval(), (torch.randn(4, 4),))
    to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
