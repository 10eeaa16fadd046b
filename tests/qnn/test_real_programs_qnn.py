"""Issue 10's name kind through the QNN path, on the real HTP backend: an
``nn.Sequential`` (its argument is named ``input``) lowers with folding on, with the runtime
names of folding off. (A constant table lookup, ``table[idx]``, does not get this far: the
wrapper's ``torch.export.export(strict=True)`` itself fails on it, before folding.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from .helpers import (
    assert_kept_whole_ops_gone,
    assert_no_static_partition,
    assert_runs_on_htp,
    compiler_specs,
    lower_with_wrapper,
    partitioner_of,
)


CASES = {
    "sequential_input_name": (lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), (2, 8)),
    "sequential_with_constant_only_branch": (
        lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), (1, 8)),
}


@pytest.mark.parametrize("preserve_names", [None, True], ids=["default_names", "restored_names"])
@pytest.mark.parametrize("name", list(CASES))
def test_real_program_kinds_lower_on_htp_with_folding(name, preserve_names):
    """With names restored, the copy of the unfolded program keeps the placeholder named
    ``input`` (a graph copy would rename it ``input_1``, away from its InputSpec)."""
    make, shape = CASES[name]
    torch.manual_seed(0)
    module = make().eval()
    inputs = (torch.randn(shape),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(True), preserve_names=preserve_names)
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    off = lower_with_wrapper(module, inputs, compiler_specs(False))
    names = lambda m: [n.name for n in m.exported_program().graph.nodes]  # noqa: E731
    assert names(manager) == names(off)
    assert_runs_on_htp(manager, module, inputs)
