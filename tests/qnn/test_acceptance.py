"""Issue 5's acceptance tests: constant-only ops QNN keeps whole, on HTP, fold off vs on.

Fold off must strand the kept-whole op in a partition the HTP rule refuses (lowering fails with
executorch's "was not decomposed or delegated"); fold on must lower with no partition lacking a
runtime input, every kept-whole op folded or delegated, and the Edge names of fold off.
"""

from __future__ import annotations

import pytest
import torch

from .helpers import (
    STRANDED,
    assert_kept_whole_ops_gone,
    assert_names_kept,
    assert_no_static_partition,
    assert_stranded_by_htp_rule,
    compiler_specs,
    export_for_qnn,
    lower_stock_with,
    assert_runs_on_htp,
    lower_with_wrapper,
    partitioner_of,
)
from tests.invariants import assert_same_outputs
from .models import CASES
from tests.invariants import assert_close_all

import qnn

# scatter_on_constants strands nothing: its constant scatters are core ATen ops, which run on the
# CPU undecomposed (test_constant_scatters_run_on_the_cpu_without_folding)
STRANDING = [name for name in CASES if name not in ("linear_feeds_add_and_masked_select", "scatter_on_constants")]


def _lower_off(case, module, inputs):
    """Fold off through the stock flow; returns (error, partitioner report)."""
    partitioner = qnn.QnnPartitioner(compiler_specs(False), skip_node_op_set=set(case.skip_ops))
    ep = export_for_qnn(module, inputs)
    with pytest.raises(RuntimeError, match=STRANDED) as error:
        lower_stock_with(partitioner, ep, case.skip_ops)
    return error.value, partitioner.reports[-1]


@pytest.mark.parametrize("name", STRANDING)
def test_fold_off_strands_kept_whole_op_on_htp(name):
    case = CASES[name]
    error, report = _lower_off(case, case.make().eval(), case.inputs())
    assert_stranded_by_htp_rule(error, report)


@pytest.mark.parametrize("name", list(CASES))
def test_fold_on_lowers(name):
    case = CASES[name]
    module, inputs = case.make().eval(), case.inputs()
    manager = lower_with_wrapper(module, inputs, compiler_specs(True), case.skip_ops, preserve_names=True)
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    folded = {d.node: d for d in report.fold_report.decisions}
    kept_whole = qnn.kept_whole_ops()
    constant_kept_whole = [d for d in folded.values() if d.target in kept_whole and d.reason.constant_only]
    assert not constant_kept_whole, constant_kept_whole
    assert any(d.folded and d.target in kept_whole for d in folded.values())
    assert not report.decomposed
    assert_runs_on_htp(manager, module, inputs)

    # the same names as without folding (fold off: the partitioner's view before it fails)
    off = qnn.QnnPartitioner(compiler_specs(False), skip_node_op_set=set(case.skip_ops))
    try:
        lower_stock_with(off, export_for_qnn(module, inputs), case.skip_ops)
    except RuntimeError as error:
        assert STRANDED in str(error)
    assert_names_kept(report, off.reports[-1])
    if name != "linear_feeds_add_and_masked_select":
        assert report.renamed, "folding shifted no name: the model does not exercise renaming"


class _RuntimeScatterAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.register_buffer("base", torch.randn(4, 8, generator=g))
        self.register_buffer("index", torch.randint(0, 4, (2, 8), generator=g))
        self.register_buffer("src", torch.randn(2, 8, generator=g))

    def forward(self, x):
        return torch.relu(self.base.scatter_add(0, self.index, self.src)) + x.scatter_add(0, self.index, self.src)


@pytest.mark.parametrize("fold", [False, True])
def test_runtime_scatter_add_runs_on_the_cpu(fold):
    """Real HTP validates ``ScatterElements`` only with reduction NONE (QNN 2.49: "incorrect
    Value 1, expected < 1"), so a runtime ``scatter_add`` stays on the CPU; being a core ATen op
    it has nothing to decompose into, so the partitioner does not keep it whole and the program
    lowers. The constant one folds (fold on) or runs on the CPU too (fold off: the HTP rule
    refuses its constant-only partition)."""
    module, inputs = _RuntimeScatterAdd().eval(), (torch.randn(4, 8, generator=torch.Generator().manual_seed(6)),)
    manager = lower_with_wrapper(module, inputs, compiler_specs(fold), {"aten.relu.default"})
    cpu = qnn.describe_partitions(manager).cpu_ops
    assert cpu.get("aten.scatter_add.default") == (1 if fold else 2), cpu
    declined = partitioner_of(manager).reports[-1].declined_by_qnn
    scatters = [n.name for n in manager.exported_program().graph.nodes if n.target is not None
                and "scatter_add" in str(n.target) and declined.get(n.name, "").startswith("refused by QNN's op validation")]
    assert len(scatters) == cpu["aten.scatter_add.default"], declined  # every one: HTP refuses reduction ADD
    assert_runs_on_htp(manager, module, inputs)


def test_masked_select_case_is_not_stranded_without_folding():
    """The constant linear feeding ``x + k`` and ``k[mask].sum()`` shares its partition with
    the runtime add, so the HTP rule does not strand it even without folding; the masked
    select (data-dependent size) stays on the CPU in both cases."""
    case = CASES["linear_feeds_add_and_masked_select"]
    module, inputs = case.make().eval(), case.inputs()
    manager = lower_with_wrapper(module, inputs, compiler_specs(False), case.skip_ops)
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    summary = qnn.describe_partitions(manager)
    assert summary.partitions == 1
    assert summary.cpu_ops == {"aten.index.Tensor": 1, "aten.sum.dim_IntList": 1}


@pytest.mark.parametrize("name", list(CASES))
def test_folded_program_computes_the_same(name):
    """Folding as the QNN lowering does it (after QNN's export passes) keeps the outputs."""
    from folding import fold_constants

    case = CASES[name]
    module, inputs = case.make().eval(), case.inputs()
    ep = export_for_qnn(module, inputs)
    folded = fold_constants(ep).program
    assert_same_outputs(ep, folded, inputs)
    assert_close_all(module(*inputs), folded.module()(*inputs))
