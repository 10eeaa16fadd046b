"""Counts of the work a fold does, for tests that rule out repeated or quadratic work.

Nothing here is part of a result, and no record carries a count that only tests read: a test
wraps the call it measures in `counting()` and reads the counts; outside such a block `count`
does nothing but one list check. (The one count a result carries is the report's
`FoldReport.evaluated_nodes`, the ops run at fold time, from `Evaluation.evaluated`: public,
in the report's JSON and `benchmarks.scale`'s table.)

Counted names:
    ``attempts``: attempts of the top-level fold, discarded ones included (`fold.py`);
    ``analysis_nodes``: nodes visited by `analysis.analyze`, top-level graph and bodies.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Hashable, Iterator

_active: list[collections.Counter] = []


def count(name: Hashable, n: int = 1) -> None:
    """Add `n` to `name` in every open `counting()` block."""
    for counts in _active:
        counts[name] += n


@contextlib.contextmanager
def counting() -> Iterator[collections.Counter]:
    """Count the work done inside the block; yields the `collections.Counter` it fills."""
    counts: collections.Counter = collections.Counter()
    _active.append(counts)
    try:
        yield counts
    finally:
        _active.remove(counts)
