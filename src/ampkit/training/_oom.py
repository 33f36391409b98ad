"""Out-of-memory errors: recognising them, and freeing what a failed attempt held.

Recovering from an out-of-memory error takes more than catching it: the exception's traceback keeps every
frame of the failed attempt alive, and with them its activations, so a retry would start with the memory
still taken. :func:`release_memory` drops those frames, collects the cycles and returns the CUDA cache.
(:class:`ampkit.memory.MemoryBudget` provokes such errors on purpose, for tests without a GPU.)
"""

from __future__ import annotations

import gc
import traceback

import torch

__all__ = ["OutOfMemoryError", "is_out_of_memory", "release_memory"]

# torch.OutOfMemoryError (torch 2.4+; ampkit needs 2.7) is torch.cuda.OutOfMemoryError.
OutOfMemoryError: type[RuntimeError] = torch.OutOfMemoryError

# Allocators that do not raise OutOfMemoryError still say so in the message (CPU, MPS, XPU, older CUDA paths).
# cuBLAS and cuDNN report a failed allocation of their own (a handle, a workspace taken from a full device) as
# a plain RuntimeError with their status name: freeing memory and retrying smaller cures those too.
_OOM_MESSAGES = (
    "out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory",
    "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (any device), as opposed to a bug that a retry would repeat.

    >>> is_out_of_memory(RuntimeError("CUDA error: out of memory")), is_out_of_memory(ValueError("shape"))
    (True, False)
    """
    if isinstance(exc, OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def release_memory(exc: BaseException | None = None) -> None:
    """Free what a failed attempt held: its frames (kept by ``exc``'s traceback), garbage cycles, the CUDA cache.

    Call it *outside* the ``except`` block, after the last reference to the attempt's tensors is gone.

    >>> try:
    ...     big = torch.zeros(1 << 20); raise RuntimeError("out of memory")
    ... except RuntimeError as e:
    ...     failed = e
    >>> release_memory(failed); del failed
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # chained exceptions keep their own tracebacks
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
    gc.collect()
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch declares no types for it (2.13)
        torch.cuda.empty_cache()
