"""How the values of tensors fit fp16 and bf16: accumulated on the device, read once.

:class:`StatsAccumulator` takes any number of tensors (one module's activations over several steps, say) and
keeps, on their device, a histogram of binary exponents ``floor(log2|x|)``, counts of zeros, non-finite and
overflowing values, the extreme magnitudes, and (optionally) the squared rounding error a cast to fp16 and to
bf16 would make. :meth:`StatsAccumulator.summary` reads it all in one transfer and returns :class:`TensorStats`,
whose shares are exact: every fp16/bf16 threshold below the maximum is a power of two, so it is a bin edge,
and multiplying by a loss scale ``2^k`` moves every value exactly ``k`` bins up.

    >>> acc = StatsAccumulator()
    >>> acc.update(torch.tensor([0.0, 1.0, 2.0**-26, 2.0**-20, 1e5]))
    >>> s = acc.summary()
    >>> s.count, s.share("fp16", "underflow"), s.share("fp16", "subnormal"), s.share("fp16", "overflow")
    (5, 0.2, 0.2, 0.2)
    >>> s.underflow_share("fp16", scale_log2=4)   # 2^-26 * 2^4 = 2^-22: representable (subnormal) once scaled
    0.0
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from ._formats import BF16, FP16
from ._tensor_stats import E_HI, E_LO, NBINS, TensorStats

__all__ = ["StatsAccumulator", "TensorStats", "read_summaries", "exponent_histogram", "E_LO", "E_HI", "NBINS", "KINDS"]

KINDS = ("weights", "grads", "inputs", "outputs", "output_grads")
"""What a module's statistics cover: its own parameters, their gradients, its floating inputs and outputs, and the
gradients flowing back into its outputs (the activation gradients)."""

# Counter slots of the device-side vector.
_COUNT, _ZEROS, _NONFINITE, _FP16_OVER, _BF16_OVER = range(5)


def exponent_histogram(bins: torch.Tensor, *, shared_memory: bool | None = None) -> torch.Tensor:
    """How many of ``bins`` (integers in ``[0, NBINS)``) fall in each bin, as int64 on their device. No host sync.

    On the CPU, ``bincount``. On an accelerator ``bincount`` sizes its output from the data's maximum (a sync),
    and ``index_add_`` of ones makes every value an atomic add on one of a few counters: a 25 M-value activation,
    most of it within a few binary exponents, serialises millions of atomics on the same addresses. ``histc``
    with fixed edges counts in each block's shared memory first. It counts in the input's dtype, so the bins go in
    as float64, exact to 2^53 values a bin (float32 would stop counting exactly at 2^24). ``shared_memory=True``
    takes that path on the CPU too (for tests; the counts are the same).

    >>> exponent_histogram(torch.tensor([0, 2, 2, NBINS - 1]))[[0, 1, 2, NBINS - 1]].tolist()
    [1, 0, 2, 1]
    >>> exponent_histogram(torch.tensor([0, 2, 2, NBINS - 1]), shared_memory=True)[[0, 1, 2, NBINS - 1]].tolist()
    [1, 0, 2, 1]
    """
    if shared_memory is None:
        shared_memory = bins.device.type != "cpu"
    if not shared_memory:
        return torch.bincount(bins.reshape(-1), minlength=NBINS)
    # Bin i is [i - 0.5, i + 0.5): integer values sit in the middle of their bin, far from any edge.
    return torch.histc(bins.reshape(-1).double(), bins=NBINS, min=-0.5, max=NBINS - 0.5).long()


class StatsAccumulator:
    """Accumulates how tensors fit fp16/bf16 without leaving their device; :meth:`summary` syncs once.

    ``rounding=False`` skips the two casts that measure rounding error. Tensors are read in float32, whatever
    their dtype; integer tensors are ignored.

    ``max_values`` (the cheap mode used while training) bounds the work per tensor: a larger tensor is read
    through an evenly strided subset of about that many values (the stride is prime, so it does not keep
    hitting the same channel of a contiguous layout), and counts and shares describe that subset. The largest
    magnitude is still exact (one extra pass), and a non-finite or overflowing value the subset missed still
    counts once, so neither ever goes unreported.
    """

    def __init__(self, *, rounding: bool = True, max_values: int | None = None) -> None:
        if max_values is not None and max_values < 1:
            raise ValueError(f"max_values must be a positive number of values per tensor (or None: all), got {max_values}.")
        self.rounding = rounding
        self.max_values = max_values
        self._device: torch.device | None = None
        self._hist: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._extremes: torch.Tensor | None = None  # (max |x|, min non-zero |x|)
        self._squares: torch.Tensor | None = None  # (fp16 err^2, fp16 ref^2, bf16 err^2, bf16 ref^2), float64

    def _init(self, device: torch.device) -> None:
        self._device = device
        self._hist = torch.zeros(NBINS, dtype=torch.int64, device=device)
        self._counts = torch.zeros(5, dtype=torch.int64, device=device)
        # Built by kernels, not copied from host values: a host-to-device copy would wait for the device.
        self._extremes = torch.stack([torch.zeros((), device=device), torch.full((), math.inf, device=device)])
        self._squares = torch.zeros(4, dtype=torch.float64, device=device)

    def update(self, tensor: torch.Tensor) -> None:
        """Add the values of ``tensor`` (detached; any floating dtype). No host-device sync."""
        if not tensor.is_floating_point() or tensor.numel() == 0:
            return
        if self._device is None:
            self._init(tensor.device)
        x = tensor.detach().reshape(-1)
        full_max: torch.Tensor | None = None
        if self.max_values is not None and x.numel() > self.max_values:
            full_max = torch.linalg.vector_norm(x, ord=math.inf).to(device=self._device, dtype=torch.float32)  # NaN if any
            x = x[:: _prime_at_least(-(-x.numel() // self.max_values))]
        x = x.to(device=self._device, dtype=torch.float32)
        # Few full passes over x: this runs on every module's tensors during a sampled training step.
        a = x.abs()
        clean = torch.nan_to_num(a, nan=0.0, posinf=0.0)  # non-finite values drop out of histogram and extremes
        nonfinite = (a != clean).sum()
        empty = (clean == 0).sum()  # zeros and the non-finite values just zeroed
        # clean = m * 2^e with m in [0.5, 1): floor(log2 clean) = e - 1. frexp gives e = 0 for 0, so zeros land
        # in the bin of exponent -1 and are taken out of it again below.
        self._hist.add_(exponent_histogram(torch.frexp(clean).exponent - (E_LO + 1)))  # type: ignore[union-attr]
        self._hist[-1 - E_LO].sub_(empty)  # type: ignore[index]
        counts = torch.stack(
            [
                torch.full((), x.numel(), dtype=torch.int64, device=self._device),
                empty - nonfinite,
                nonfinite,
                (clean > FP16.max).sum(),
                (clean > BF16.max).sum(),
            ]
        )
        largest = clean.max()
        if full_max is not None:
            # What the subset may have missed: a non-finite value anywhere, an overflow anywhere; the exact maximum.
            missed_bad = ~torch.isfinite(full_max)
            counts[2] = torch.maximum(counts[2], missed_bad.long())
            counts[3] = torch.maximum(counts[3], (full_max > FP16.max).long())
            counts[4] = torch.maximum(counts[4], (full_max > BF16.max).long())
            largest = torch.where(missed_bad, largest, full_max)
        self._counts.add_(counts)  # type: ignore[union-attr]
        extremes = torch.stack([largest, torch.where(clean > 0, clean, math.inf).min()])
        self._extremes = torch.stack([torch.maximum(self._extremes[0], extremes[0]), torch.minimum(self._extremes[1], extremes[1])])  # type: ignore[index]
        if self.rounding:
            parts = []
            finite = torch.isfinite(x)
            for fmt in (FP16, BF16):
                rounded = x.to(fmt.dtype).float()
                kept = finite & torch.isfinite(rounded)  # overflow is counted as such, not as rounding error
                parts.append(torch.linalg.vector_norm(torch.where(kept, x - rounded, 0.0), dtype=torch.float64) ** 2)
                parts.append(torch.linalg.vector_norm(torch.where(kept, x, 0.0), dtype=torch.float64) ** 2)
            self._squares.add_(torch.stack(parts))  # type: ignore[union-attr]

    def summary(self) -> TensorStats:
        """The host-side statistics of everything added so far (one device-to-host transfer)."""
        return read_summaries([self])[0][0]

    def _state(self) -> torch.Tensor | None:
        """Everything as one float64 vector (counts stay exact below 2^53), laid out as :func:`_from_state` reads it."""
        if self._device is None:
            return None
        return torch.cat([self._hist.double(), self._counts.double(), self._extremes.double(), self._squares])  # type: ignore[index,union-attr,list-item]


_STATE_LEN = NBINS + 5 + 2 + 4


@functools.lru_cache(maxsize=256)
def _prime_at_least(n: int) -> int:
    """The smallest prime >= ``n`` (a stride coprime with every power-of-two channel count).

    >>> [_prime_at_least(n) for n in (1, 2, 8, 14)]
    [2, 2, 11, 17]
    """
    candidate = max(2, n)
    while any(candidate % d == 0 for d in range(2, math.isqrt(candidate) + 1)):
        candidate += 1
    return candidate


def _from_state(v: list[float], rounding: bool) -> TensorStats:
    hist = [int(c) for c in v[:NBINS]]
    count, zeros, nonfinite, fp16_over, bf16_over = (int(c) for c in v[NBINS : NBINS + 5])
    max_abs, min_nonzero = v[NBINS + 5 : NBINS + 7]
    return TensorStats(
        count=count, zeros=zeros, nonfinite=nonfinite, overflow={"fp16": fp16_over, "bf16": bf16_over},
        histogram=hist, max_abs=max_abs, min_abs_nonzero=min_nonzero if math.isfinite(min_nonzero) else 0.0,
        squares=list(v[NBINS + 7 :]) if rounding else None,
    )


def read_summaries(accumulators: Sequence[StatsAccumulator], scalars: Sequence[torch.Tensor] = ()) -> tuple[list[TensorStats], list[float]]:
    """The summaries of ``accumulators`` and the values of ``scalars`` (0-dim tensors, or any tensor: its values
    flattened in order) in one device-to-host transfer.

    >>> a, b = StatsAccumulator(), StatsAccumulator(); a.update(torch.ones(3))
    >>> stats, values = read_summaries([a, b], [torch.tensor(4.0)])
    >>> [s.count for s in stats], values
    ([3, 0], [4.0])
    """
    states = [acc._state() for acc in accumulators]
    parts = [s for s in states if s is not None] + [t.detach().double().reshape(-1) for t in scalars]
    device = parts[0].device if parts else None
    flat = torch.cat([p.to(device) for p in parts]).cpu().tolist() if parts else []
    stats: list[TensorStats] = []
    offset = 0
    for acc, state in zip(accumulators, states):
        if state is None:
            stats.append(TensorStats())
            continue
        stats.append(_from_state(flat[offset : offset + _STATE_LEN], acc.rounding))
        offset += _STATE_LEN
    return stats, flat[offset:]
