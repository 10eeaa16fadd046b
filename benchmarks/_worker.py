"""Build-worker initialiser, kept free of heavy imports.

A spawned worker unpickles its initialiser before anything else, so pointing
file descriptor 2 at the log here (before torch/executorch are imported) keeps
their import-time warnings and native chatter off the parent's progress display.
"""

from __future__ import annotations

import logging
import os
from typing import Optional


def init(log_path: Optional[str]) -> None:
    """Redirect stderr to ``log_path`` (if given), configure logging, use one torch thread."""
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s: %(message)s")
    import torch

    torch.set_num_threads(1)
