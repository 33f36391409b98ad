"""Out-of-memory errors: recognising them, freeing what a failed attempt held, and provoking them on purpose.

Recovering from an out-of-memory error takes more than catching it: the exception's traceback keeps every
frame of the failed attempt alive, and with them its activations, so a retry would start with the memory
still taken. :func:`release_memory` drops those frames, collects the cycles and returns the CUDA cache.

:class:`MemoryBudget` makes a CPU (or any device) behave like a device of a given size: it counts the bytes
of live tensors exactly and raises ``torch.OutOfMemoryError`` when an op would go over, which is how the
batch-size finder and the engine's micro-batching are tested without a GPU.

    >>> import torch
    >>> with MemoryBudget(4096):
    ...     a = torch.zeros(512)             # 2 KiB: fits
    ...     try:
    ...         b = torch.zeros(1024)        # 4 KiB more: over the budget
    ...     except torch.OutOfMemoryError as e:
    ...         print(is_out_of_memory(e))
    True
"""

from __future__ import annotations

import gc
import traceback
from typing import Any

import torch

from .._util.units import parse_bytes
from .accounting import LiveBytes

__all__ = ["OutOfMemoryError", "is_out_of_memory", "release_memory", "MemoryBudget"]

# torch.OutOfMemoryError appeared in torch 2.5; torch.cuda.OutOfMemoryError is the same class there.
OutOfMemoryError: type[RuntimeError] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

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
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class MemoryBudget(LiveBytes):
    """Raises ``torch.OutOfMemoryError`` when the live tensors would exceed ``budget`` bytes, as a device would.

    Counts exactly what :class:`~ampkit.memory.accounting.LiveBytes` counts: every storage an op returns while
    the budget is active, plus what :meth:`track` is given (parameters, optimizer state made before). The
    failing op's result is dropped, so the bytes are given back as a real allocator's would never be taken.

    Args:
        budget: bytes, or a size like ``"512MiB"``.
        tensors: tensors already allocated that count against the budget (a model's parameters).
    """

    def __init__(self, budget: int | str, tensors: Any = ()) -> None:
        super().__init__()
        if isinstance(budget, str):
            budget = parse_bytes(budget)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"MemoryBudget(budget={budget!r}): pass a positive number of bytes or a size like '512MiB'.")
        self.budget = budget
        self.failures = 0
        self.track(tensors)

    def _add(self, t: torch.Tensor) -> None:
        before, peak = self.current, self.peak
        super()._add(t)
        if self.current > self.budget:
            self.failures += 1
            self.peak = peak  # the failed allocation never happened
            wanted = self.current - before
            raise OutOfMemoryError(
                f"out of memory (ampkit.memory.MemoryBudget): tried to allocate {wanted} bytes with {before} of "
                f"{self.budget} bytes in use."
            )
