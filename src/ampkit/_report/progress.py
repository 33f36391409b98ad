"""The progress protocol every tool reports through (bench, doctor, memory, profile), and its silent default.

A tool calls ``start(total)`` once with its units of work, ``update(description, advance)`` as phases start and
units end, and ``finish()``; the command line turns that into a bar on a terminal or a line per phase in a log. One
protocol, so that each tool's reporters take the others' calls.

    >>> reporter = NullReporter()
    >>> reporter.start(10); reporter.update("32-true: training", advance=5); reporter.finish()
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NullReporter", "Reporter"]


class Reporter(Protocol):
    """Receives a tool's progress: the total work, then descriptions and advances, then the end."""

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
