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

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .estimate import MemoryEstimate, estimate

__all__ = ["Fit", "largest_batch", "resize_batch", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"80 GB"``, ``"512MiB"`` or a plain number of bytes, as bytes.

    >>> parse_bytes("24GiB"), parse_bytes("1.5 GB"), parse_bytes("4096")
    (25769803776, 1500000000, 4096)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size; write it like 24GiB, 80GB, 512MiB or a number of bytes.")
    return int(float(m.group(1)) * _UNITS[unit])


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


def largest_batch(
    model: nn.Module, example_batch: Any, optimizer: Any = None, policy: str = "32-true", device: torch.device | str | None = None,
    *, budget: int, limit: int = 2**24, **options: Any,
) -> Fit:
    """The largest batch size whose predicted peak (:attr:`MemoryEstimate.peak`) is at most ``budget`` bytes.

    Guesses from two estimates (memory is close to affine in the batch size), brackets the guess and bisects:
    about ten estimates. ``options`` go to :func:`estimate` (``loss_fn``, engine options).
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
    # Memory is close to affine in the batch size: a secant through two sizes guesses the answer, a bracket
    # widened geometrically around the guess makes it certain, bisection finishes it. About 8-10 estimates,
    # where doubling from 1 took 2 log2(answer).
    probe = min(64, limit)
    if fits(probe) and probe < limit:
        # Secant iterations: the small-batch slope underestimates (fixed temporaries dominate there), so the
        # guess is refined through the latest two points until it settles.
        a, guess = 1, probe
        for _ in range(4):
            slope = (at(guess).peak - at(a).peak) / (guess - a)
            nxt = max(probe, min(limit, int(guess + (budget - at(guess).peak) / slope))) if slope > 0 else limit
            a, guess = guess, nxt
            if abs(guess - a) <= max(1, a // 256):
                break
        step = max(1, guess // 256)
        if fits(guess):
            low, high = guess, guess + step
            while high <= limit and fits(high):
                low, step = high, step * 2
                high = low + step
            if high > limit:
                return Fit(limit, at(limit), None, limit_reached=True) if fits(limit) else _bisect(low, limit, fits, at)
        else:
            low, high = guess - step, guess
            while not fits(max(low, probe)):
                high, step = max(low, probe), step * 2
                low = high - step
            low = max(low, probe)
        return _bisect(low, high, fits, at)
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
        if high > limit:
            return Fit(low, at(low), None, limit_reached=True)
    return _bisect(low, high, fits, at)


def _bisect(low: int, high: int, fits: Any, at: Any) -> Fit:
    """``low`` fits and ``high`` does not: narrow to adjacent sizes."""
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return Fit(low, at(low), at(high))
