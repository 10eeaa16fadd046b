"""Suite-wide settings.

Under pytest-xdist (``scripts/run_tests.sh`` runs two workers on this project's two-core
machines) each worker runs torch on one thread, so the workers do not oversubscribe the cores.
"""

from __future__ import annotations

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
