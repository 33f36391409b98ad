"""Step timing that is correct on every device: wall clock on CPU, CUDA events on GPU.

A CUDA kernel launch returns before the kernel runs, so ``perf_counter`` around a GPU step measures the launch,
not the work. :class:`StepTimer` records an event pair per step and reads them all in :meth:`StepTimer.flush`,
one synchronisation per chunk of steps instead of one per step. On CPU the work is done when the call returns.

    >>> timer = StepTimer(torch.device("cpu"))
    >>> for _ in range(3):
    ...     with timer.step():
    ...         _ = torch.ones(64, 64) @ torch.ones(64, 64)
    >>> len(timer.flush())
    3
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence

import torch

__all__ = ["StepTimer", "summarize"]


class StepTimer:
    """Times steps on ``device``; :meth:`flush` returns the seconds of the steps recorded since the last flush."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._pending: list[tuple[object, object]] = []
        self._cpu_times: list[float] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time the enclosed step."""
        if self.cuda:
            # Recorded on the timed device's stream: a bare record() uses the *current* device's, which is another
            # GPU's clock when the step runs on cuda:1 while cuda:0 is current.
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            yield
            end.record(stream)
            self._pending.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu_times.append(time.perf_counter() - t0)

    def flush(self) -> list[float]:
        """Seconds per step recorded since the last flush (synchronises once on CUDA)."""
        if self.cuda:
            if self._pending:
                self._pending[-1][1].synchronize()  # type: ignore[attr-defined]
            times = [s.elapsed_time(e) / 1e3 for s, e in self._pending]  # type: ignore[attr-defined]
            self._pending = []
            return times
        times, self._cpu_times = self._cpu_times, []
        return times


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile of ``times`` (seconds).

    >>> summarize([1.0, 2.0, 3.0, 4.0, 100.0])["median"]
    3.0
    """
    if not times:
        raise ValueError("no step times to summarize: every step was warm-up; raise --steps above --warmup.")
    ordered = sorted(times)
    if len(ordered) == 1:
        return {"median": ordered[0], "p10": ordered[0], "p90": ordered[0]}
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    return {"median": statistics.median(ordered), "p10": deciles[0], "p90": deciles[-1]}
