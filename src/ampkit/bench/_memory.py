"""Memory a bench run holds: exact accounting (from :mod:`ampkit.memory._accounting`) and the process peak RSS.

On CUDA the allocator's peak is the honest figure. On CPU there is no allocator peak to read, so the bench
counts the peak of live tensor bytes during the policy's setup and steps (:class:`StepPeak`, the definition
``ampkit memory`` prints), and the exact bytes of each part beside it: parameters, their gradients, optimizer
state, fp32 master weights, and the activations autograd saves for backward (counted once per storage,
parameters excluded, one micro-batch's at a time). The process peak RSS (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``; from :mod:`ampkit.memory._process`) is reported beside it.
"""

from __future__ import annotations

from ..memory._accounting import (
    SavedActivations,
    StepPeak,
    tensor_bytes,
    training_state_bytes,
)
from ..memory._process import peak_rss_bytes, reset_peak_rss

__all__ = ["SavedActivations", "StepPeak", "peak_rss_bytes", "reset_peak_rss", "tensor_bytes", "training_state_bytes"]
