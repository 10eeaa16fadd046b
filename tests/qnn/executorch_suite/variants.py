"""The two ways each suite test lowers: executorch's flow (``stock``) and ours (``fold``).

Every lowering in the suite's operator and model classes goes through one function,
``to_edge_transform_and_lower_to_qnn``, which the suite imports by name from
``executorch.backends.qualcomm.utils.utils`` into two modules: ``tests/utils.py``
(``TestQNN.lower_module_and_test_output``) and ``tests/test_qnn_delegate.py`` (tests that lower
directly). `install` binds that name in both modules to the variant's function:

- ``stock``: executorch's own function, called as the test calls it;
- ``fold``: `qnn.to_edge_transform_and_lower_to_qnn` (same arguments), with our
  ``fold_constants`` compile spec appended to the test's specs (`with_fold_spec`, what
  `qnn.generate_qnn_executorch_compiler_spec(..., fold_constants=True)` appends: the default
  `folding.FoldPolicy`); every other argument exactly as the test passes it.

Both also install the emulator's ``verify_output`` and ``get_adb_tool`` (emulator.py) on the
suite's ``TestQNN``. Each call of the lowering is counted (`LoweringCounter`), so a test that
never reached it (it failed earlier, or lowers some other way) is visible in the results.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Dict, List

from . import emulator

VARIANTS = ("stock", "fold")


class LoweringCounter:
    """How many times a variant's lowering function was called, and how many returned."""

    def __init__(self) -> None:
        self.calls = 0
        self.returned = 0

    def wrap(self, function: Callable) -> Callable:
        def lowering(*args: Any, **kwargs: Any):
            self.calls += 1
            result = function(*args, **kwargs)
            self.returned += 1
            return result

        lowering.__name__ = lowering.__qualname__ = "to_edge_transform_and_lower_to_qnn"
        lowering.__wrapped__ = function
        return lowering


def with_fold_spec(compiler_specs):
    """The test's compiler specs with our ``fold_constants`` spec appended (each method's list,
    for a per-method dict); a list that already has one is left as it is."""
    from folding import FoldPolicy
    from qnn import FOLD_CONSTANTS_KEY, FoldSpec

    def add(specs: List) -> List:
        if any(spec.key == FOLD_CONSTANTS_KEY for spec in specs):
            return list(specs)
        return list(specs) + [FoldSpec(FoldPolicy()).to_compile_spec()]

    if isinstance(compiler_specs, dict):
        return {name: add(specs) for name, specs in compiler_specs.items()}
    return add(compiler_specs)


def _fold_lowering(module, inputs, compiler_specs, *args, **kwargs):
    """`qnn.to_edge_transform_and_lower_to_qnn` with the ``fold_constants`` spec added."""
    import qnn

    return qnn.to_edge_transform_and_lower_to_qnn(module, inputs, with_fold_spec(compiler_specs), *args, **kwargs)


def lowering_function(variant: str) -> Callable:
    """The unwrapped lowering function of `variant`."""
    if variant == "stock":
        from executorch.backends.qualcomm.utils.utils import to_edge_transform_and_lower_to_qnn

        return to_edge_transform_and_lower_to_qnn
    if variant == "fold":
        return _fold_lowering
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def install(suite: types.ModuleType, variant: str) -> LoweringCounter:
    """Bind `variant`'s lowering (counted) in the suite's modules and the emulator on ``TestQNN``.

    Returns:
        The counter of this installation's lowering calls.
    """
    import sys

    from .suite import UTILS_MODULE

    counter = LoweringCounter()
    lowering = counter.wrap(lowering_function(variant))
    utils: Dict = sys.modules[UTILS_MODULE].__dict__
    for namespace in (utils, suite.__dict__):
        namespace["to_edge_transform_and_lower_to_qnn"] = lowering
    test_qnn = utils["TestQNN"]
    test_qnn.verify_output = emulator.verify_output
    test_qnn.get_adb_tool = emulator.get_adb_tool
    return counter
