"""The largest batch whose predicted training step fits a memory budget, found on fake tensors.

Every try is an :func:`~ampkit.memory.estimate`, so nothing is allocated and a CPU answers for a GPU. The
answer covers what torch allocates for tensors (``torch.cuda.max_memory_allocated``); leave room for the
CUDA context and the allocator's cache when choosing the budget (a few hundred MiB to a GiB).

    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 10))
    >>> batch = (torch.randn(8, 1024), torch.randint(0, 10, (8,)))
    >>> fits = largest_batch(model, batch, policy="bf16-mixed", budget=256 * 2**20)
    >>> fits.estimate.peak <= 256 * 2**20 < fits.next_estimate.peak   # batch_size fits, batch_size + 1 does not
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._compat import tree_map
from .._util.units import parse_bytes  # re-exported: its home was here
from ..policy import Policy
from ._estimate import MemoryEstimate, estimate

__all__ = ["Fit", "largest_batch", "resize_batch", "parse_bytes"]

def resize_batch(batch: Any, n: int) -> Any:
    """``batch`` with every tensor's first dimension set to ``n``, as meta tensors (same dtype and memory format).

    >>> x = resize_batch((torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), 100)
    >>> [(t.shape[0], t.dtype, t.device.type) for t in x]
    [(100, torch.float32, 'meta'), (100, torch.int64, 'meta')]
    """

    def resize(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        out = torch.empty((n, *t.shape[1:]), dtype=t.dtype, device="meta")
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    return tree_map(resize, batch)


@dataclass(frozen=True)
class Fit:
    """The answer of :func:`largest_batch`: ``batch_size`` (0 when not even one sample fits) and its estimate."""

    batch_size: int
    estimate: MemoryEstimate | None
    """The estimate at ``batch_size`` (None when it is 0)."""
    next_estimate: MemoryEstimate | None
    """The estimate at ``batch_size + 1``, which does not fit (None when the search hit ``limit``)."""
    limit_reached: bool = False


_MAX_NEWTON_ESTIMATES = 9
"""Estimates the line-following search may spend before it bisects the bracket it found."""


def largest_batch(
    model: nn.Module, example_batch: Any, optimizer: Any = None, policy: str | Policy = "32-true", device: torch.device | str | None = None,
    *, budget: int, limit: int = 2**24, **options: Any,
) -> Fit:
    """The largest batch size whose predicted peak (:attr:`MemoryEstimate.peak`) is at most ``budget`` bytes.

    The peak is affine in the batch size wherever one moment of the step holds it (every activation, attention's
    T x T terms too, grows linearly with the batch at a fixed sequence length); small batches, where fixed
    temporaries hold the peak instead, lie on a flatter line. So: one estimate at batch 1 gives a first guess
    (its activations and batch as the bytes per sample); each guess is estimated beside its neighbour, which
    both checks it (the answer fits and one more sample does not) and measures the line's slope there for the
    next guess. Typically 5 estimates; after ``_MAX_NEWTON_ESTIMATES`` the bracket found so far is bisected.
    ``options`` go to :func:`estimate` (``loss_fn``, engine options).
    """
    if budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes, got {budget}.")
    cache: dict[int, MemoryEstimate] = {}

    def at(n: int) -> MemoryEstimate:
        if n not in cache:
            cache[n] = estimate(model, resize_batch(example_batch, n), optimizer, policy, device, **options)
        return cache[n]

    def fits(n: int) -> bool:
        return at(n).peak <= budget

    if not fits(1):
        return Fit(0, None, at(1))
    low, high = 1, limit + 1  # low fits; high does not (limit + 1 stands for "not found yet")
    one = at(1)
    guess = 1 + (budget - one.peak) // max(1, one.activations + one.batch)
    while high - low > 1 and len(cache) < _MAX_NEWTON_ESTIMATES:
        guess = min(max(guess, low + 1), high - 1)
        neighbour = guess + 1 if fits(guess) else guess - 1
        low, high = (guess, high) if fits(guess) else (low, guess)
        if high - low > 1 and neighbour <= limit:
            low, high = (neighbour, high) if fits(neighbour) else (low, min(high, neighbour))
        if high - low <= 1 or neighbour > limit:
            break
        slope = abs(at(guess).peak - at(neighbour).peak)  # bytes per sample, between adjacent sizes
        if slope == 0:
            break  # the peak does not grow here: no line to follow
        guess += (budget - at(guess).peak) // slope  # Newton's step along the local line (floor: stay inside)
    if low == limit:
        return Fit(limit, at(limit), None, limit_reached=True)
    if high > limit:  # nothing failed yet: double from the largest size known to fit
        high = min(2 * low, limit)
        while fits(high):
            if high == limit:
                return Fit(limit, at(limit), None, limit_reached=True)
            low, high = high, min(2 * high, limit)
    return _bisect(low, high, fits, at)


def _bisect(low: int, high: int, fits: Any, at: Any) -> Fit:
    """``low`` fits and ``high`` does not: narrow to adjacent sizes."""
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return Fit(low, at(low), at(high))
