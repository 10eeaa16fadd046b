"""The fold stage in executorch's export recipes (``executorch.export``).

executorch 1.5.1's QNN recipe (``QNNRecipeProvider``, backends/qualcomm/recipes/
qnn_recipe_provider.py; ``QNNRecipeType.FP16`` is its one recipe) lowers with executorch's own
``QnnPartitioner`` and QNN's to-edge passes. `export_recipe` returns that recipe with
`qnn.QnnPartitioner` in its place, built from the same compile specs plus ``fold_constants``:
the partitioner folds in its pre-decomposition hook (``transform_for_pre_decomposition``), on the
very program object QNN's to-edge passes are bound to, so encodings are kept.

    from executorch.export import export
    session = export(model, [inputs], qnn.export_recipe(soc_model="SM8650"))
    pte = session.get_pte_buffer()
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from folding import FoldPolicy

from .compile_spec import FOLD_CONSTANTS_KEY, FoldSpec
from .errors import CompileSpecError
from .partitioner import QnnPartitioner
from .sdk import load_qnn_sdk


def export_recipe(recipe_type: Any = None, *, fold_constants: bool = True,
                  fold_policy: Optional[FoldPolicy] = None, **kwargs: Any):
    """executorch's QNN ``ExportRecipe`` with the fold stage.

    Args:
        recipe_type: a ``QNNRecipeType`` (default ``QNNRecipeType.FP16``).
        fold_constants: add the ``fold_constants`` compile spec (default True).
        fold_policy: its `folding.FoldPolicy` (default ``FoldPolicy()``).
        **kwargs: the recipe's own arguments (``soc_model`` (required), ``skip_node_id_set``,
            ``skip_node_op_set``, ``skip_mutable_buffer``), validated by executorch.

    Returns:
        An ``executorch.export.ExportRecipe`` for ``executorch.export.export``.

    Raises:
        QnnSdkError: the QNN libraries are missing or unusable (qnn/sdk.py).
        CompileSpecError: `fold_policy` is not a `folding.FoldPolicy`.
        ValueError: executorch rejected the recipe arguments (e.g. no ``soc_model``).
    """
    load_qnn_sdk()
    from executorch.backends.qualcomm.recipes.qnn_recipe_provider import QNNRecipeProvider
    from executorch.backends.qualcomm.recipes.qnn_recipe_types import QNNRecipeType

    if fold_policy is not None and not isinstance(fold_policy, FoldPolicy):
        raise CompileSpecError(f"fold_policy must be a folding.FoldPolicy, got {type(fold_policy).__name__}")
    recipe = QNNRecipeProvider().create_recipe(recipe_type or QNNRecipeType.FP16, **kwargs)
    if recipe is None:
        raise ValueError(f"executorch's QNN recipe provider has no recipe {recipe_type!r}")
    lowering = recipe.lowering_recipe
    [stock] = lowering.partitioners
    specs = [s for s in stock.compiler_specs_snapshot if s.key != FOLD_CONSTANTS_KEY]
    if fold_constants:
        specs.append(FoldSpec(fold_policy or FoldPolicy()).to_compile_spec())
    partitioner = QnnPartitioner(
        specs,
        skip_node_id_set=stock.skip_node_id_set,
        skip_node_op_set=stock.skip_node_op_set,
        skip_mutable_buffer=stock.skip_mutable_buffer,
    )
    lowering = dataclasses.replace(
        lowering,
        partitioners=[partitioner],
        edge_transform_passes=[lambda method, program: partitioner.to_edge_passes(program)],
    )
    return dataclasses.replace(recipe, lowering_recipe=lowering)
