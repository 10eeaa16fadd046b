"""`qnn.export_recipe`: executorch's QNN export recipe with the fold stage, on the real backend."""

from __future__ import annotations

import pytest
import torch
from executorch.export import export

import qnn

from .helpers import assert_runs_on_htp
from .models import RELU, LinearCutOffByRelu, SkipIdShift


def _x(*shape):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(12)),)


def test_recipe_folds_and_the_pte_runs_on_htp():
    module, inputs = SkipIdShift().eval(), _x(4, 16)
    recipe = qnn.export_recipe(soc_model="SM8650")
    [partitioner] = recipe.lowering_recipe.partitioners
    pte = export(module, [inputs], recipe).get_pte_buffer()
    assert isinstance(partitioner, qnn.QnnPartitioner) and partitioner.fold_reports[-1].folded
    report = partitioner.reports[-1]
    assert report.partitions and not report.refused
    (got,) = qnn.run_pte(pte, inputs)
    with torch.no_grad():
        want = module(*inputs)
    assert (got - want).abs().max() <= 5e-3 * want.abs().max()


def test_recipe_lowers_what_executorchs_recipe_refuses():
    """A constant-only linear cut off by a skipped relu: executorch's recipe hands HTP a
    partition without inputs (its context compile fails); the folding recipe lowers and runs."""
    from executorch.export import export as et_export
    from executorch.backends.qualcomm.recipes.qnn_recipe_provider import QNNRecipeProvider
    from executorch.backends.qualcomm.recipes.qnn_recipe_types import QNNRecipeType

    module, inputs = LinearCutOffByRelu().eval(), _x(4, 64)
    stock = QNNRecipeProvider().create_recipe(QNNRecipeType.FP16, soc_model="SM8650", skip_node_op_set={RELU})
    with pytest.raises(Exception, match="Failed to generate Qnn context binary"):
        et_export(module, [inputs], stock).get_pte_buffer()
    session = export(module, [inputs], qnn.export_recipe(soc_model="SM8650", skip_node_op_set={RELU}))
    (got,) = qnn.run_pte(session.get_pte_buffer(), inputs)
    with torch.no_grad():
        want = module(*inputs)
    assert (got - want).abs().max() <= 5e-3 * want.abs().max()


def test_recipe_rejects_a_bad_policy():
    with pytest.raises(qnn.CompileSpecError, match="FoldPolicy"):
        qnn.export_recipe(soc_model="SM8650", fold_policy={"max_tensor_bytes": 1})
