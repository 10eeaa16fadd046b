"""Counting the work a fold does, for the tests that rule out repeated or quadratic work,
without counters in the product: `calls` counts how often the given functions ran while a
block ran (the standard library's profiler, which sees every Python call)."""

from __future__ import annotations

import contextlib
import cProfile
import pstats
from collections import Counter
from typing import Callable, Iterator


@contextlib.contextmanager
def calls(**functions: Callable) -> Iterator[Counter]:
    """Count the calls of each function in `functions` (by name) made while the block runs.

    Example: ``with calls(attempts=folding.core.plan.make_plan) as work: fold_constants(ep)``, then
    ``work["attempts"]``. A function is matched by its code object's file, first line and name,
    so a function decorated with `functools` wrappers must be given unwrapped
    (``f.__wrapped__``). The counter is filled when the block ends.
    """
    counts: Counter = Counter()
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield counts
    finally:
        profile.disable()
        stats = pstats.Stats(profile).stats  # (file, line, name) -> (primitive, total calls, ...)
        for label, fn in functions.items():
            code = fn.__code__
            key = (code.co_filename, code.co_firstlineno, code.co_name)
            counts[label] = stats[key][1] if key in stats else 0
