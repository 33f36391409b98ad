"""How a profile reports its progress: the same protocol as the bench's (``start``, ``update``, ``finish``: the CLI
shows the bench's bar on a terminal), and :class:`PhaseLines`, a line per phase for a log (CI, ``nohup``, a pipe),
where a bar cannot redraw and would show nothing.

The profile advances by optimizer steps through its windows (warm-up, plain, timed, syncs, trace), then by one
per DataLoader trial; each window and each trial is a phase, described as :func:`window_phase` says.

    >>> import io
    >>> out, times = io.StringIO(), iter([0.0, 0.0, 0.5, 4.0, 9.0])
    >>> lines = PhaseLines(out, clock=lambda: next(times))
    >>> lines.start(5)
    >>> lines.update(window_phase("warmup"), advance=1)
    >>> lines.update(window_phase("warmup"), advance=1)  # the same phase: no new line
    >>> lines.update(window_phase("timed"), advance=3)
    >>> lines.finish()
    >>> print(out.getvalue(), end="")
    progress: 5 steps (the profile's optimizer steps, then one per DataLoader setting timed)
    [0:00] 1/5 steps: warm-up steps (not measured)
    [0:04] 5/5 steps: timed steps (phases timed)
    [0:09] 5/5 steps: finished
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from .._report.progress import Reporter

__all__ = ["PhaseLines", "Progress", "window_phase"]

_WINDOWS = {
    "warmup": "warm-up steps (not measured)",
    "plain": "plain steps (the overhead's baseline)",
    "timed": "timed steps (phases timed)",
    "syncs": "steps with the host syncs counted",
    "trace": "steps traced by torch.profiler",
}


def window_phase(window: str) -> str:
    """The progress's words for the profiler window ``window`` (see :data:`ampkit.profile._session.WINDOWS`).

    >>> window_phase("syncs")
    'steps with the host syncs counted'
    """
    return _WINDOWS.get(window, window)


Progress = Reporter
"""Receives a profile's progress: the total steps, then descriptions and advances, then the end (the tools'
shared protocol, :class:`ampkit._report.progress.Reporter`)."""


class PhaseLines:
    """Progress as plain lines on ``stream`` (stderr by default): one when a phase starts, with the time since the
    start and the steps done of the total; ``clock`` (seconds) is ``time.monotonic``, a test passes its own."""

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._total = self._done = 0
        self._start = 0.0
        self._phase: str | None = None

    def start(self, total: int) -> None:
        self._total, self._done, self._phase = total, 0, None
        self._start = self._clock()
        self._print(f"progress: {total} steps (the profile's optimizer steps, then one per DataLoader setting timed)")

    def update(self, description: str, advance: int = 0) -> None:
        self._done += advance
        now = self._clock()
        if description != self._phase:
            self._phase = description
            self._line(now, description)

    def finish(self) -> None:
        self._line(self._clock(), "finished")

    def _line(self, now: float, what: str) -> None:
        minutes, seconds = divmod(int(now - self._start), 60)
        self._print(f"[{minutes}:{seconds:02d}] {self._done}/{self._total} steps: {what}")

    def _print(self, line: str) -> None:
        # Flushed: a log read while the profile runs (tail -f, a CI console) shows each line when it is written.
        print(line, file=self._stream or sys.stderr, flush=True)
