"""Out-of-memory errors provoked on purpose, beside the training layer's recognising and freeing of them.

:func:`is_out_of_memory` and :func:`release_memory` live in :mod:`ampkit.training._oom` (the engine's
micro-batching needs them) and are exported here too. :class:`MemoryBudget` makes a CPU (or any device) behave like a device of a given size: it counts the bytes
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

from typing import Any

import torch

from .._util.units import parse_bytes
from ..training._oom import OutOfMemoryError, is_out_of_memory, release_memory
from ._accounting import LiveBytes

__all__ = ["OutOfMemoryError", "is_out_of_memory", "release_memory", "MemoryBudget"]

class MemoryBudget(LiveBytes):
    """Raises ``torch.OutOfMemoryError`` when the live tensors would exceed ``budget`` bytes, as a device would.

    Counts exactly what :class:`~ampkit.memory.LiveBytes` counts: every storage an op returns while
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
