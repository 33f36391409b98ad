"""How sure a speed-up is: a confidence interval for the ratio of two median step times.

The bench's speed-up is ``median(reference times) / median(policy times)``. Step times scatter (the OS, other
processes, clock boost), so two medians of the same code differ by a few percent from run to run; a speed-up
is only a finding when its interval clears 1.0. The interval here is a percentile bootstrap: resample each
policy's step times with replacement, take the ratio of the two resampled medians, repeat, and keep the central
95% of the ratios. It assumes nothing about the shape of the timing distribution (step times are skewed: a few
slow steps, never fast ones).

What it does not see: the steps of one run are not fully independent (a background job slows several steps in
a row), so the interval is somewhat too narrow on a busy machine; the bench interleaves the policies in rounds
so such spells land on every policy, which is also why the two samples are resampled independently rather than
paired step by step.

    >>> ref = [0.020, 0.021, 0.019, 0.020, 0.022, 0.020, 0.021, 0.020]
    >>> low, high = speedup_interval(ref, [t / 2 for t in ref])
    >>> 1.8 < low <= 2.0 <= high < 2.2
    True
    >>> speedup_interval(ref, ref[:3]) is None  # too few timed steps to say anything
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["speedup_interval", "CONFIDENCE", "MIN_TIMED_STEPS", "RESAMPLES"]

CONFIDENCE = 0.95
"""Share of the bootstrap ratios the interval holds."""
MIN_TIMED_STEPS = 5
"""Fewer timed steps than this in either sample give no interval: a median of 3 values can land anywhere."""
RESAMPLES = 2000
"""Bootstrap rounds: enough for the 2.5% and 97.5% percentiles to settle to about 0.1% of the ratio."""
_BLOCK_VALUES = 2_000_000
"""Resampled values drawn at once (16 MB of float64)."""


def speedup_interval(reference: Sequence[float], run: Sequence[float], *, seed: int = 0) -> tuple[float, float] | None:
    """The ``CONFIDENCE`` interval of ``median(reference) / median(run)``, or None with too few steps.

    ``reference`` and ``run`` are step times in seconds. The resampling uses its own seeded generator, so the
    same times give the same interval and the caller's random state is untouched.

    >>> speedup_interval([0.010] * 10, [0.010] * 10)
    (1.0, 1.0)
    """
    ref, mine = np.asarray(reference, dtype=float), np.asarray(run, dtype=float)
    # Fewer steps give no honest median; a zero or non-finite time would make the ratio meaningless.
    if not all(x.size >= MIN_TIMED_STEPS and bool(np.all(np.isfinite(x) & (x > 0))) for x in (ref, mine)):
        return None
    rng = np.random.default_rng(seed)
    ratios = _resampled_medians(ref, rng) / _resampled_medians(mine, rng)
    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _resampled_medians(times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``RESAMPLES`` resamples of ``times``, drawn a block of rows at a time: one (RESAMPLES, n)
    draw would take gigabytes for a run of many thousand steps."""
    rows = max(1, _BLOCK_VALUES // times.size)
    blocks = [np.median(times[rng.integers(0, times.size, (min(rows, RESAMPLES - start), times.size))], axis=1)
              for start in range(0, RESAMPLES, rows)]  # fmt: skip
    return np.concatenate(blocks)
