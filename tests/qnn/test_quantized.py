"""Quantized programs (QnnQuantizer 8a8w and 16a4w block/LPBQ): a constant-only linear cut off by
a skipped relu. Both flows: our wrapper, and executorch's stock ``to_edge_transform_and_lower``
with `qnn.QnnPartitioner` folding in its pre-decomposition hook.
"""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

import qnn

from .helpers import (
    STRANDED,
    assert_encodings_kept,
    assert_kept_whole_ops_gone,
    assert_names_kept,
    assert_no_static_partition,
    assert_runs_on_htp,
    assert_stranded_by_htp_rule,
    compiler_specs,
    export_for_qnn,
    lower_stock,
    lower_stock_with,
    lower_with_wrapper,
    partitioner_of,
)
from tests.invariants import assert_same_outputs
from .models import RELU, LinearCutOffByRelu

QUANT = {
    "8a8w": dict(quant_dtype=QuantDtype.use_8a8w),
    "16a4w_block": dict(quant_dtype=QuantDtype.use_16a4w_block, block_size_map={"linear": (1, 32), "linear_1": (1, 32)}),
}


@pytest.fixture(scope="module", params=list(QUANT))
def quantized(request):
    """(name, converted GraphModule, inputs), quantized once per scheme."""
    from .helpers import quantize

    module = LinearCutOffByRelu().eval()
    inputs = (torch.randn(4, 64, generator=torch.Generator().manual_seed(7)),)
    return request.param, quantize(module, inputs, **QUANT[request.param]), inputs


def _aten(quantized):
    _, module, inputs = quantized
    return export_for_qnn(module, inputs)


def test_stock_flow_fold_off_strands(quantized):
    # `lower_stock`'s own partitioner, built here: a failed run does not return it
    partitioner = qnn.QnnPartitioner(compiler_specs(False, quantized=True), skip_node_op_set={RELU})
    with pytest.raises(RuntimeError, match=STRANDED) as error:
        lower_stock_with(partitioner, _aten(quantized), {RELU})
    assert_stranded_by_htp_rule(error.value, partitioner.reports[-1])


def test_stock_flow_fold_on_keeps_encodings_and_names(quantized):
    """The hook folds the very program object QNN's to-edge passes were built from, so the
    lifted integer constants get the encodings QNN reads without folding."""
    name, module, inputs = quantized
    reference = _aten(quantized)
    unfolded = copy.deepcopy(reference)
    off = qnn.QnnPartitioner(compiler_specs(False, quantized=True), skip_node_op_set={RELU})
    with pytest.raises(RuntimeError, match=STRANDED):
        lower_stock_with(off, copy.deepcopy(reference), {RELU})

    ep = copy.deepcopy(reference)
    manager, partitioner = lower_stock(ep, compiler_specs(True, quantized=True), {RELU}, preserve_names=True)
    on = partitioner.reports[-1]
    assert_no_static_partition(on)
    assert_kept_whole_ops_gone(manager)
    assert on.fold_report is partitioner.fold_reports[-1]
    assert any(d.folded and d.target == "aten.linear.default" for d in on.fold_report.decisions)
    assert assert_encodings_kept(on, off.reports[-1], unfolded) >= 1
    assert_names_kept(on, off.reports[-1])
    assert on.renamed  # the runtime linear got its unfolded name back
    # the hook folded `ep` in place; its values are those of the unfolded program
    assert_same_outputs(unfolded, ep, inputs)
    assert_runs_on_htp(manager, module, inputs, quantized=True)


def test_wrapper_fold_on_lowers(quantized):
    name, module, inputs = quantized
    manager = lower_with_wrapper(module, inputs, compiler_specs(True, quantized=True), {RELU})
    report = partitioner_of(manager).reports[-1]
    assert_no_static_partition(report)
    assert_kept_whole_ops_gone(manager)
    encoded = [c.placeholder for c in report.fold_report.lifted if not c.dtype.startswith("float")]
    assert encoded and all(p in report.quant_attrs for p in encoded)
    summary = qnn.describe_partitions(manager)
    assert summary.partitions == 1 and summary.cpu_op_count == 0
    assert_runs_on_htp(manager, module, inputs, quantized=True)


def test_passes_bound_to_another_object_fail_loudly(quantized):
    """docs/design.md's binding hazard: QNN's to-edge passes built from a program object other than
    the one folded miss the new constants; FoldQDQ would then drop their dequantize and hand
    HTP raw integers. The partitioner refuses to lower that."""
    ep = _aten(quantized)
    other = copy.deepcopy(ep)  # the passes are bound to this one, the hook folds `ep`
    with pytest.raises(qnn.EncodingLostError, match="no QNN encoding"):
        lower_stock(ep, compiler_specs(True, quantized=True), {RELU}, passes_from=other)
