"""Build-worker initialiser and progress messages, kept free of heavy imports.

A spawned worker unpickles its initialiser before anything else, so pointing
file descriptor 2 at the log here (before torch/executorch are imported) keeps
their import-time warnings and native chatter off the parent's progress display.
`announce` tells the parent which row a worker starts building (`init`'s queue).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

_messages: Any = None  # the parent's queue (a spawned worker), or None
_listener: Optional[Callable[[str], None]] = None  # in-process builds (--jobs 1)


def init(log_path: Optional[str], messages: Any = None) -> None:
    """Redirect stderr to ``log_path`` (if given), configure logging, use one torch thread;
    `announce` puts its messages on ``messages`` (a multiprocessing queue) when given."""
    global _messages
    _messages = messages
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s: %(message)s")
    import torch

    torch.set_num_threads(1)


def listen(listener: Optional[Callable[[str], None]]) -> None:
    """Send `announce` messages of this process to ``listener`` (builds without workers)."""
    global _listener
    _listener = listener


def announce(text: str) -> None:
    """Tell the parent what this worker starts now (e.g. ``llama · qnn fp16 · fold_constants``)."""
    logging.getLogger(__name__).info("building %s", text)
    try:
        if _messages is not None:
            _messages.put(text)
        elif _listener is not None:
            _listener(text)
    except Exception:  # noqa: BLE001 - progress display only
        pass
