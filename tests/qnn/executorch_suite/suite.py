"""Importing executorch 1.5.1's QNN test suite and configuring it for the x86-64 HTP emulator.

The suite is ``executorch/backends/qualcomm/tests/test_qnn_delegate.py`` (in the executorch
wheel). Its ``TestQNN`` class attributes (``soc_model``, ``backend``, ``enable_x86_64``, ...) are
normally set by ``setup_environment()``, which its ``__main__`` block runs on ``sys.argv`` (and
its own ``tests/conftest.py`` runs on a synthetic argv under pytest). `load_suite` does the
same, with the argv of an x86-64 host run (`SUITE_ARGV`: ``--enable_x86_64 --soc_model SM8650
--backend htp``), so no device (adb) is ever addressed.

Import order (qnn/sdk.py): `qnn.load_qnn_sdk` runs first, so ``QNN_SDK_ROOT`` names the
QNN 2.49.40 libraries when the suite's ``@unittest.skipIf(is_qnn_sdk_version_...)``
decorators are evaluated at class definition, and executorch never downloads an SDK.

Optional dependencies: the suite module imports, at import time, packages that this project's
pinned environment does not install (`OPTIONAL_MODULES`: ``graphviz``/``pydot`` for executorch's
graph drawing, ``torchsr``/``timm``/``torchaudio`` for three example models). When one is
missing, a placeholder module stands in only for the duration of the import; each name taken
from it raises `MissingOptionalDependency` (a ``ModuleNotFoundError``) when used, so a test that
needs the package is reported as one the emulator run cannot do, and every other test runs.
The placeholders are removed from ``sys.modules`` right after the import, so no other code
sees a package that is not there; ``transformers``, which probes for those packages when it is
imported, is imported before they exist (`PROBING_MODULES`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import types
import unittest
from typing import List, Optional, Sequence

SUITE_MODULE = "executorch.backends.qualcomm.tests.test_qnn_delegate"
UTILS_MODULE = "executorch.backends.qualcomm.tests.utils"

CLASSES = (
    "TestQNNFloatingPointOperator",
    "TestQNNQuantizedOperator",
    "TestQNNFloatingPointModel",
    "TestQNNQuantizedModel",
)
"""The operator and model classes of the suite, in the order the runner visits them (issue 31)."""

SOC_MODEL = "SM8650"
ARTIFACT_DIR = "/tmp/executorch_qnn_suite_artifacts"
SUITE_ARGV = [
    "test_qnn_delegate.py",
    "--soc_model", SOC_MODEL,
    "--backend", "htp",
    "--build_folder", "build-x86",
    "--enable_x86_64",
    "--artifact_dir", ARTIFACT_DIR,
]
"""What ``setup_environment()`` parses: the flags of an x86-64 host-simulator run, as in the
suite's own ``tests/conftest.py`` and ``test_qnn_delegate_x86.py`` (SM8650, HTP)."""

OPTIONAL_MODULES = ("graphviz", "pydot", "torchsr", "torchsr.models", "timm", "timm.models", "torchaudio")
PROBING_MODULES = ("transformers",)
"""Imported before the placeholders exist: at import they record which optional packages are
installed (``importlib.util.find_spec``, which a placeholder without a spec would break)."""


class MissingOptionalDependency(ModuleNotFoundError):
    """A name the suite imported from a package that is not installed was used."""


def _placeholder_module(name: str) -> types.ModuleType:
    """A module whose every public attribute is a class that raises `MissingOptionalDependency`."""
    module = types.ModuleType(name)

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        class Missing:
            def __init__(self, *args, **kwargs):
                raise MissingOptionalDependency(f"{name}.{attr}: {name} is not installed", name=name.split(".")[0])

        Missing.__name__ = Missing.__qualname__ = attr
        return Missing

    module.__getattr__ = __getattr__
    return module


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ModuleNotFoundError, ValueError):
        return True


def load_suite(product_root: Optional[str] = None) -> types.ModuleType:
    """Import the suite module, configured for the x86-64 emulator; returns the module.

    Args:
        product_root: a checkout whose ``folding``/``qnn`` packages are imported instead of the
            installed ones (put first on ``sys.path``); None keeps the normal resolution.
    """
    if product_root:
        sys.path.insert(0, os.path.abspath(product_root))
    import qnn  # noqa: F401  (sets QNN_SDK_ROOT="" so executorch never downloads an SDK)

    qnn.load_qnn_sdk()
    os.makedirs(ARTIFACT_DIR, exist_ok=True)
    for name in PROBING_MODULES:  # they ask importlib.util.find_spec about optional packages at import
        if not _missing(name):
            importlib.import_module(name)
    placeholders = [name for name in OPTIONAL_MODULES if _missing(name)]
    for name in placeholders:
        sys.modules[name] = _placeholder_module(name)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[name])
    try:
        suite = importlib.import_module(SUITE_MODULE)
    finally:
        for name in placeholders:
            sys.modules.pop(name, None)
    saved = sys.argv
    try:
        sys.argv = list(SUITE_ARGV)
        suite.setup_environment()
    finally:
        sys.argv = saved
    return suite


def list_tests(suite: types.ModuleType, classes: Sequence[str] = CLASSES, match: Optional[str] = None,
               limit: Optional[int] = None) -> List[str]:
    """The test ids ``Class.test_name`` to run, in a deterministic order.

    Order: `classes` as given, then unittest's own (sorted) method order within a class.
    `match` is a regular expression searched in the id (a plain substring works as well);
    `limit` keeps the first N after filtering.
    """
    loader = unittest.TestLoader()
    pattern = re.compile(match) if match else None
    ids = []
    for cls_name in classes:
        cls = getattr(suite, cls_name)
        for method in loader.getTestCaseNames(cls):
            test_id = f"{cls_name}.{method}"
            if pattern is None or pattern.search(test_id):
                ids.append(test_id)
    return ids[:limit] if limit is not None else ids
