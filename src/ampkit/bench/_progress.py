"""How the bench runner reports progress: the tools' protocol and its silent default (:mod:`ampkit._report.progress`), a rich progress bar for a terminal,
and plain lines for a log (CI, ``nohup``, a pipe), where a bar cannot redraw and would show nothing.

The runner describes what runs as ``"<run>: <phase>"`` (``"bf16-mixed: round 2/5"``, ``"bf16-mixed: done"``,
``"bf16-true-sr: compiling the optimizer step"``, see :func:`ampkit.bench._policy_run.compile_phase`) and advances by
steps: every run's memory-measuring and training steps, and one for its evaluation.

    >>> reporter = NullReporter()
    >>> reporter.start(10); reporter.update("32-true: training", advance=5); reporter.finish()
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .._report.progress import NullReporter, Reporter

__all__ = ["PLAIN_INTERVAL_S", "NullReporter", "PlainReporter", "Reporter", "RichReporter"]

PLAIN_INTERVAL_S = 30.0
"""Most seconds between two of :class:`PlainReporter`'s lines while a run is under way (a run's start and end
print at once): a line a minute or two is enough to see that a long bench lives, and fills no log."""


class RichReporter:
    """A rich progress bar on ``console`` (stderr by default, so stdout stays the results)."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=True,
        )
        self._task: int | None = None

    def start(self, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("starting", total=total)

    def update(self, description: str, advance: int = 0) -> None:
        if self._task is not None:
            self._progress.update(self._task, description=description, advance=advance)

    def finish(self) -> None:
        self._progress.stop()


class PlainReporter:
    """Progress as plain lines on ``stream`` (stderr by default), for a log: a line when a run starts, when it starts
    compiling (a phase ``"compiling ..."``: the wait that follows is why) and when it is done, and between them at
    most one every ``interval`` seconds, each with the time since the start and the steps done of the total (the
    runner's: every run's memory-measuring and training steps, one per evaluation).

    ``clock`` (seconds) is ``time.monotonic``; a test passes its own.

    >>> import io
    >>> out, times = io.StringIO(), iter([0.0, 0.0, 5.0, 31.0, 40.0, 95.0])
    >>> reporter = PlainReporter(out, clock=lambda: next(times))
    >>> reporter.start(9)
    >>> reporter.update("32-true: measuring memory")  # a run starts: printed
    >>> reporter.update("32-true: round 1/1", advance=4)  # 5 s later: not yet
    >>> reporter.update("32-true: evaluating", advance=4)  # 31 s: printed
    >>> reporter.update("32-true: done", advance=1)  # a run is done: printed
    >>> reporter.finish()
    >>> print(out.getvalue(), end="")
    progress: 9 steps (every run's memory-measuring and training steps, and one per evaluation)
    [0:00] 0/9 steps: 32-true: measuring memory
    [0:31] 8/9 steps: 32-true: evaluating
    [0:40] 9/9 steps: 32-true: done
    [1:35] 9/9 steps: finished
    """

    def __init__(self, stream: TextIO | None = None, *, interval: float = PLAIN_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._total = self._done = 0
        self._start = self._last = 0.0
        self._runs: set[str] = set()

    def start(self, total: int) -> None:
        self._total, self._done = total, 0
        self._start = self._last = self._clock()
        self._print(f"progress: {total} steps (every run's memory-measuring and training steps, and one per evaluation)")

    def update(self, description: str, advance: int = 0) -> None:
        self._done += advance
        now = self._clock()
        run, _, phase = description.rpartition(": ")
        started = run not in self._runs
        self._runs.add(run)
        if started or phase == "done" or phase.startswith("compiling") or now - self._last >= self._interval:
            self._line(now, description)

    def finish(self) -> None:
        self._line(self._clock(), "finished")

    def _line(self, now: float, what: str) -> None:
        self._last = now
        minutes, seconds = divmod(int(now - self._start), 60)
        self._print(f"[{minutes}:{seconds:02d}] {self._done}/{self._total} steps: {what}")

    def _print(self, line: str) -> None:
        # Flushed: a log read while the bench runs (tail -f, a CI console) shows each line when it is written.
        print(line, file=self._stream or sys.stderr, flush=True)
