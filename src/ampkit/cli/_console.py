"""The console the subcommands print their tables to: the terminal's width on a terminal, no limit elsewhere.

rich lays a table out to the console's width, and a console that is not a terminal (a pipe, a CI log, a file)
is 80 columns unless ``COLUMNS`` says otherwise: a 15-column bench table was squeezed until every figure was cut
short or turned on its side. A log has no width to respect, so there every column is printed whole, one row per
line, and a line is as long as its table. An explicit ``COLUMNS`` is still honoured.

    >>> import io
    >>> console = stdout_console(file=io.StringIO())  # not a terminal
    >>> console.width == LOG_WIDTH or "COLUMNS" in os.environ
    True
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

__all__ = ["stdout_console", "LOG_WIDTH"]

LOG_WIDTH = 4096
"""Width of a console that is not a terminal: wider than any table ampkit prints, so none is squeezed."""


def stdout_console(**kwargs: Any) -> Console:
    """A rich :class:`~rich.console.Console` (``kwargs`` passed on) that is :data:`LOG_WIDTH` wide when its
    output is not a terminal and ``COLUMNS`` is not set."""
    console = Console(**kwargs)
    if not console.is_terminal and "COLUMNS" not in os.environ and "width" not in kwargs:
        console.width = LOG_WIDTH
    return console
