"""How busy the machine is while a tune measures: the CPU time other processes take, and the control's drift.

A tune's figures are ratios of step times measured side by side, so a steady load slows every candidate alike and
the ratios hold; what breaks them is a machine whose pace changes under the trials (another job starting, data
workers waking up) and torch's intra-op threads contending with other processes for the cores (on a 2-core machine
with two CPU-bound processes beside it, a 2-thread step took 2 s where it takes 40 ms alone, and a 1-thread step
110 ms). Two measurements say which:

- :class:`CpuMeter`: the CPU time the *other* processes took over an interval, in cores, from the kernel's own
  counters (Linux's ``/proc/stat`` less this process's ``/proc/self/stat``); None where the OS does not say. It
  lives in :mod:`ampkit._util.cpu_load`, shared with ``ampkit profile``, which reads the same measure.
- :func:`control_drift`: how far the starting configuration's step, measured in every round of a wave, moved from
  round to round. A round whose control moved by more than :data:`ROUND_DRIFT` (and more than the control's own
  noise within a round) from the wave's typical round cannot resolve the gains a tune looks for (5-60%): its steps
  are dropped and the round measured again.

    >>> control_drift([[0.10, 0.11], [0.10, 0.10], [0.52, 0.54]])
    (5.3, [2])
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .._util.cpu_load import BUSY_CORES, CpuMeter, Load

__all__ = ["BUSY_CORES", "ROUND_DRIFT", "CpuMeter", "Load", "control_drift"]

ROUND_DRIFT = 1.25
"""A round is disturbed when its control's median step is this much slower or faster than the median round's.
Two undisturbed rounds can then differ by up to 1.25**2 = 1.56x, the largest gain a CPU tune finds (bf16 1.4-1.6x):
a control moving more than that could fake or hide any of them. On the quiet development machine the control's
round medians stayed within 1.10 of each other (digits, gpt; 4 rounds of 3 steps)."""


def control_drift(rounds: Sequence[Sequence[float]]) -> tuple[float, list[int]]:
    """The control's drift over a wave's rounds (``rounds``: its step times in each): the slowest round's median
    over the fastest's, and the rounds that **moved**: whose median lies further from the median round's than both
    :data:`ROUND_DRIFT` and the control's own spread within a round (the typical round's slowest step over its
    fastest). Steps that are merely noisy (a 1-thread step sharing its core with another process ran 60-160 ms) make
    every round alike noisy: more rounds average that out, and none is dropped for it; a machine that changed pace
    under the wave (44 ms, then 542) moves whole rounds.

    >>> control_drift([[0.10], [0.105], [0.098]])
    (1.0714285714285714, [])
    >>> control_drift([[0.07, 0.15, 0.08], [0.15, 0.07, 0.14], [0.08, 0.15, 0.07]])[1]
    []
    """
    kept = [r for r in rounds if r]
    if not kept:
        return 1.0, []
    medians = [statistics.median(r) for r in kept]
    typical = statistics.median(medians)
    noise = statistics.median(max(r) / min(r) for r in kept)
    limit = max(ROUND_DRIFT, noise)
    moved = [i for i, r in enumerate(rounds) if r and max(statistics.median(r) / typical, typical / statistics.median(r)) > limit]
    return max(medians) / min(medians), moved
