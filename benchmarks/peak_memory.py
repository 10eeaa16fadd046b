"""The process's resident set and its peak, from Linux's ``/proc/self`` (the benchmarks' one
peak-memory helper): the high-water mark ``VmHWM`` is reset to the current RSS by writing 5 to
``/proc/self/clear_refs`` (Linux >= 4.0), so a peak read after `reset_hwm` is that of the
interval since, exactly, whatever ran in between. The QNN HTP libraries and these benchmarks
run on Linux only; elsewhere each function raises OSError."""

from __future__ import annotations


def _status_bytes(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field_name} in /proc/self/status")


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes (``VmRSS``)."""
    return _status_bytes("VmRSS")


def hwm_bytes() -> int:
    """The resident set's high-water mark since the process started or the last `reset_hwm`,
    in bytes (``VmHWM``)."""
    return _status_bytes("VmHWM")


def reset_hwm() -> None:
    """Reset ``VmHWM`` to the current RSS (``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
