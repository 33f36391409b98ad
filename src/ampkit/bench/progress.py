"""How the bench runner reports progress: a tiny protocol, a silent default, and a rich progress bar.

    >>> reporter = NullReporter()
    >>> reporter.start(10); reporter.update("32-true: training", advance=5); reporter.finish()
"""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["Reporter", "NullReporter", "RichReporter"]


class Reporter(Protocol):
    """Receives the runner's progress: the total work, then descriptions and advances, then the end."""

    def start(self, total: int) -> None: ...

    def update(self, description: str, advance: int = 0) -> None: ...

    def finish(self) -> None: ...


class NullReporter:
    """Reports nothing (library use and tests)."""

    def start(self, total: int) -> None:
        pass

    def update(self, description: str, advance: int = 0) -> None:
        pass

    def finish(self) -> None:
        pass


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
