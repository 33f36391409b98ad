"""How long the GPU ran nothing while the loop trained: the gaps between its kernels, read from a profiler trace.

A step the host cannot feed fast enough (a slow batch, a sync that drains the queue, Python overhead between
small kernels) shows on the device as time in which no kernel and no copy runs. Over a window of steps,
the device is busy for the union of its kernels' and copies' intervals (overlapping streams count once) and idle
for the rest; the share of idle time is what better feeding could give back.

    >>> busy_seconds([(0, 10), (5, 20), (30, 40)], start=0, end=50) * 1e6
    30.0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceIdle", "busy_seconds", "device_idle"]


@dataclass(frozen=True)
class DeviceIdle:
    """Idle time of the device over a profiled window of ``steps`` steps."""

    window_s: float
    busy_s: float
    steps: int

    @property
    def share(self) -> float:
        """Idle share of the window."""
        return 1.0 - self.busy_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def seconds_per_step(self) -> float:
        return (self.window_s - self.busy_s) / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"share": self.share, "seconds_per_step": self.seconds_per_step, "window_s": self.window_s}


def busy_seconds(intervals: Iterable[tuple[float, float]], *, start: float, end: float) -> float:
    """The length of the union of ``intervals`` (microseconds, as the profiler's) clipped to ``[start, end]``, in
    seconds."""
    busy = 0.0
    reach = start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            busy += hi - lo
            reach = hi
    return busy / 1e6


def device_idle(prof: torch.profiler.profile, *, steps: int, start_us: float, end_us: float) -> DeviceIdle | None:
    """The device's idle time between ``start_us`` and ``end_us`` (the profiler's clock) in ``prof``, a profile of
    ``steps`` steps with CUDA activity; None when it recorded no device work (a CPU profile)."""
    intervals = [(e.time_range.start, e.time_range.end) for e in _device_events(prof.events())]
    if not intervals:
        return None
    return DeviceIdle(window_s=(end_us - start_us) / 1e6, busy_s=busy_seconds(intervals, start=start_us, end=end_us), steps=steps)


def _device_events(events: Iterable[Any]) -> Iterable[Any]:
    # Kernels, copies and sets run on the device carry its device type; the host ops that launched them do not.
    cuda = torch.autograd.DeviceType.CUDA
    return (e for e in events if e.device_type == cuda)
