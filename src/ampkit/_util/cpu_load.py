"""How busy the machine is: the CPU time other processes take over an interval, from the kernel's own counters.

A step time measured on a CPU (or fed by a CPU's data pipeline) is only the loop's own when nothing else runs on the
cores: on a 2-core machine with two CPU-bound processes beside it, a 2-thread step took 2 s where it takes 40 ms
alone. :class:`CpuMeter` reads the CPU time the *other* processes took (Linux's ``/proc/stat`` less this process's
``/proc/self/stat``), in cores; None where the OS does not say. ``ampkit tune`` and ``ampkit profile`` read the
same measure, and call the machine busy from :data:`BUSY_CORES` on.

    >>> Load(1.87, 12.0, 2).busy, Load(1.87, 12.0, 2).describe()
    (True, 'other processes took 1.9 of the 2 cores')
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BUSY_CORES", "CpuMeter", "Load"]

BUSY_CORES = 0.5
"""Other processes taking at least this many cores of CPU time (on average over an interval) make the machine busy:
a tune's progress and report say so (and on a CPU its threads stage runs first); a profile's figures are
marked disturbed."""


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


def _children_ticks() -> float:
    """Ticks this process's live children spent on a CPU (a DataLoader's workers): with :func:`_own_ticks`' count of
    the children already waited for, the whole family's. A child gone between the listing and the read is skipped."""
    pid = str(os.getpid())
    total = 0.0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2 :].split()
        if rest[1] == pid:  # the parent's pid, field 4
            total += float(rest[11]) + float(rest[12])
    return total


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
    """The CPU time other processes take between :meth:`mark` and :meth:`read`; with ``children``, this
    process's children count as its own.

    >>> meter = CpuMeter(); meter.mark(); load = meter.read()
    >>> load.others_cores is None or load.others_cores >= 0
    True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, cores: int | None = None, *, children: bool = False) -> None:
        self.clock = clock
        self.cores = cores or os.cpu_count() or 1
        self.children = children
        """Count this process's children (a DataLoader's workers, which the loop measured starts) as its own, not as
        other processes."""
        self._start: tuple[float, float | None, float | None] | None = None

    def mark(self) -> None:
        """Start an interval."""
        own = _own_ticks()
        if own is not None and self.children:
            own += _children_ticks()
        self._start = (self.clock(), _machine_busy_ticks(), own)

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
