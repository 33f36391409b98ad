"""Memory of this process, as the operating system counts it: the resident set size now, and its peak.

These are host figures, on CUDA runs too, and cost a read of a ``/proc`` file each. :func:`rss_bytes` is the
current value, which is what grows when memory leaks; :func:`peak_rss_bytes` is the high-water mark (Linux
``VmHWM``), which :func:`reset_peak_rss` brings back down to the current value (through ``/proc/self/clear_refs``).
Off Linux the current RSS is unknown (None) and the peak falls back to ``getrusage``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["peak_rss_bytes", "reset_peak_rss", "rss_bytes"]

log = logging.getLogger("ampkit")

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_STATM = "/proc/self/statm"

try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, OSError, ValueError):
    _PAGE = 4096


def rss_bytes() -> tuple[int, int] | None:
    """(RSS, its anonymous part) of this process now, from Linux ``/proc/self/statm``; None where that is missing.

    :func:`peak_rss_bytes` gives the peak; this is the current value, which is what grows.
    The anonymous part (RSS less file-backed pages) is the heap: library code paged in the first time a kernel
    runs is left out of it, so that only memory the process allocated is judged for growth.

    >>> import sys
    >>> rss = rss_bytes()
    >>> rss is None if not sys.platform.startswith("linux") else 0 < rss[1] <= rss[0]
    True
    """
    try:
        with open(_STATM, "rb") as f:
            fields = f.read().split()
        resident, shared = int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None
    return resident * _PAGE, (resident - shared) * _PAGE


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux); False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5\n")  # "5" resets VmHWM, see proc(5)
        return True
    except OSError:
        log.debug("cannot reset the peak RSS here; peak_rss_bytes is the process peak since start")
        return False


def peak_rss_bytes() -> int | None:
    """The process's peak resident set size in bytes (Linux VmHWM, else getrusage), or None if unknown.

    >>> peak_rss_bytes() > 0
    True
    """
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kB on Linux
    except (ImportError, OSError):
        return None
