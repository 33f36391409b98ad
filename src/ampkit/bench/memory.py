"""Memory a bench run holds: exact accounting (from :mod:`ampkit.memory.accounting`) and the process peak RSS.

On CUDA the allocator's peak is the honest figure. On CPU there is no allocator peak to read, so the bench
counts the bytes a training step keeps resident: parameters, their gradients, optimizer state, fp32 master
weights, and the activations autograd saves for backward (counted once per storage, parameters excluded).
The process peak RSS (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) is reported beside it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..memory.accounting import SavedActivations, tensor_bytes, training_state_bytes

__all__ = ["SavedActivations", "tensor_bytes", "training_state_bytes", "reset_peak_rss", "peak_rss_bytes"]

log = logging.getLogger("ampkit")


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


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
