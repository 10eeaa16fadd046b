"""Suite-wide settings.

Under pytest-xdist (``scripts/run_tests.sh`` runs two workers on this project's two-core
machines) each worker runs torch on one thread, so the workers do not oversubscribe the cores.
"""

from __future__ import annotations

import logging
import os

import torch

# torchao 0.18.0 registers its KernelPreference enum with torch's pytree at import, which torch
# 2.14 logs as deprecated in every process that imports it: an upstream message, kept out of the
# suite's output like the upstream warnings the pytest configuration filters.
logging.getLogger("torch.utils._pytree").addFilter(
    lambda record: "is an Enum subclass and is now natively supported" not in record.getMessage())

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
