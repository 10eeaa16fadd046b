"""Suite-wide settings.

Under pytest-xdist (``scripts/run_tests.sh`` runs two workers on this project's two-core
machines) each worker runs torch on one thread, so the workers do not oversubscribe the cores.
Once the tests are collected, the cyclic garbage collector is set for a long session of FX
graphs (`pytest_collection_finish`).
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


def pytest_collection_finish(session):
    """Python's cyclic garbage collector, set for a long session of FX graphs: the objects alive
    once the tests are collected (about half a million, mostly torch's and executorch's modules)
    are frozen, out of every later collection, and collections run less often (every 50,000 net
    allocations, not 700). FX graphs are cycles (nodes link to their graph and to each other),
    so every export, fold and lowering leaves many behind: with the default thresholds the
    collector re-scanned the whole heap often enough to take a sixth of the time (measured on
    three control-flow and lowering test files in one process: 42 s of 246 s; 12 s with these
    settings). What a test leaves behind is still collected, later."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
