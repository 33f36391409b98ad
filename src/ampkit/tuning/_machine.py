"""How busy the machine is while a tune measures: the CPU time other processes take, and the control's drift.

A tune's figures are ratios of step times measured side by side, so a steady load slows every candidate alike and
the ratios hold; what breaks them is a machine whose pace changes under the trials (another job starting, data
workers waking up) and torch's intra-op threads contending with other processes for the cores (on a 2-core machine
with two CPU-bound processes beside it, a 2-thread step took 2 s where it takes 40 ms alone, and a 1-thread step
110 ms). Two measurements say which:

- :class:`CpuMeter`: the CPU time the *other* processes took over an interval, in cores, from the kernel's own
  counters (Linux's ``/proc/stat`` less this process's ``/proc/self/stat``); None where the OS does not say.
- :func:`control_drift`: how far the starting configuration's step, measured in every round of a wave, moved from
  round to round. A round whose control moved by more than :data:`ROUND_DRIFT` (and more than the control's own
  noise within a round) from the wave's typical round cannot resolve the gains a tune looks for (5-60%): its steps
  are dropped and the round measured again.

    >>> control_drift([[0.10, 0.11], [0.10, 0.10], [0.52, 0.54]])
    (5.3, [2])
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BUSY_CORES", "ROUND_DRIFT", "CpuMeter", "Load", "control_drift"]

ROUND_DRIFT = 1.25
"""A round is disturbed when its control's median step is this much slower or faster than the median round's.
Two undisturbed rounds can then differ by up to 1.25**2 = 1.56x, the largest gain a CPU tune finds (bf16 1.4-1.6x):
a control moving more than that could fake or hide any of them. On the quiet development machine the control's
round medians stayed within 1.10 of each other (digits, gpt; 4 rounds of 3 steps)."""
BUSY_CORES = 0.5
"""Other processes taking at least this many cores of CPU time (on average over an interval) make the machine busy:
the progress and the report say so, and on a CPU the threads stage runs first."""


def _ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def _machine_busy_ticks() -> float | None:
    """Ticks all CPUs spent running anything (user, nice, system, irq, softirq, steal not counted: another VM's)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (float(x) for x in fields[1:8])
    return user + nice + system + irq + softirq


def _own_ticks() -> float | None:
    """Ticks this process (all its threads) and its waited-for children spent on a CPU."""
    try:
        with open("/proc/self/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields after its closing parenthesis are fixed.
    rest = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (float(x) for x in rest[11:15])
    return utime + stime + cutime + cstime


@dataclass(frozen=True)
class Load:
    """The other processes' CPU time over an interval, in cores (1.0: one core kept busy throughout)."""

    others_cores: float | None
    """None where the OS does not say (not Linux)."""
    seconds: float
    cores: int

    @property
    def busy(self) -> bool:
        """Other processes took at least :data:`BUSY_CORES` of CPU on average.

        >>> Load(1.9, 10.0, 2).busy, Load(0.1, 10.0, 2).busy, Load(None, 10.0, 2).busy
        (True, False, False)
        """
        return self.others_cores is not None and self.others_cores >= BUSY_CORES

    def describe(self) -> str:
        """In words, for the progress and the report.

        >>> Load(1.87, 12.0, 2).describe()
        'other processes took 1.9 of the 2 cores'
        """
        if self.others_cores is None:
            return "the OS does not say how busy the machine is"
        return f"other processes took {self.others_cores:.1f} of the {self.cores} cores"


class CpuMeter:
    """The CPU time other processes take between :meth:`mark` and :meth:`read`.

    >>> meter = CpuMeter(); meter.mark(); load = meter.read()
    >>> load.others_cores is None or load.others_cores >= 0
    True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, cores: int | None = None) -> None:
        self.clock = clock
        self.cores = cores or os.cpu_count() or 1
        self._start: tuple[float, float | None, float | None] | None = None

    def mark(self) -> None:
        """Start an interval."""
        self._start = (self.clock(), _machine_busy_ticks(), _own_ticks())

    def read(self) -> Load:
        """The load since :meth:`mark` (which starts the next interval)."""
        if self._start is None:
            self.mark()
        assert self._start is not None
        began, busy0, own0 = self._start
        self.mark()
        now, busy1, own1 = self._start
        seconds = max(1e-9, now - began)
        if None in (busy0, busy1, own0, own1):
            return Load(None, seconds, self.cores)
        others = ((busy1 - busy0) - (own1 - own0)) / _ticks_per_second() / seconds  # type: ignore[operator]
        return Load(max(0.0, others), seconds, self.cores)


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
