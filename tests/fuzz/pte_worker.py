"""A process that runs .pte files for the fuzzer: ``python -m tests.fuzz.pte_worker``.

Reads requests from stdin and writes replies to stdout, each a length-prefixed pickle:
request ``(buffer, calls)``, reply ``("ok", outputs)`` or ``("error", "Type: message")``. A
kernel that aborts kills only this process (`lower.run_pte` starts a new one). A plain
subprocess, not multiprocessing: spawning would re-run the caller's ``__main__`` (a reproducer
script has no ``if __name__ == "__main__"`` guard).
"""

from __future__ import annotations

import pickle
import struct
import sys


def read_message(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def write_message(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by libraries must not corrupt the replies
    while True:
        request = read_message(stdin)
        if request is None:
            return
        buffer, calls = request
        try:
            method = _load_for_executorch_from_buffer(buffer)
            outputs = [[t.clone() for t in method.forward(tuple(inputs))] for inputs in calls]
            write_message(stdout, ("ok", outputs))
        except Exception as e:  # noqa: BLE001 - reported to the caller
            write_message(stdout, ("error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    main()
