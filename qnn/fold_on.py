"""Folding on for code written against executorch's QNN lowering function, in one line.

Qualcomm's LLM pipeline (executorch/examples/qualcomm/oss_scripts/llama/wrappers/llm_wrappers.py)
imports ``to_edge_transform_and_lower_to_qnn`` from executorch and builds its compile specs
with executorch's generator. One line after that import turns folding on for every method it
lowers (the decoder's ``prefill_forward`` and ``kv_forward``, the token embedding)::

    from qnn.fold_on import to_edge_transform_and_lower_to_qnn

It is `qnn.to_edge_transform_and_lower_to_qnn` with `qnn.with_fold_constants` applied to the
specs (default `folding.FoldPolicy`; a method whose specs already carry a ``fold_constants``
spec keeps its policy).
"""

from __future__ import annotations

from .compile_spec import with_fold_constants
from .lowering import to_edge_transform_and_lower_to_qnn as _lower


def to_edge_transform_and_lower_to_qnn(module, inputs, compiler_specs, *args, **kwargs):
    """`qnn.to_edge_transform_and_lower_to_qnn` (executorch's arguments) with every method's
    ``compiler_specs`` given the ``fold_constants`` spec (`qnn.with_fold_constants`).

    Returns:
        The lowered ``EdgeProgramManager``.

    Raises:
        Whatever `qnn.to_edge_transform_and_lower_to_qnn` raises.
    """
    return _lower(module, inputs, with_fold_constants(compiler_specs), *args, **kwargs)
