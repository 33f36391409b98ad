"""What every GPU-suite script shares so that a step cut at its limit still leaves its figures.

The suite runs each script with a time limit, and a GPU window is short: a script that prints its table only at
the end leaves nothing when it is killed (the first GPU run lost five steps that way). So a script

- takes ``--time-limit S`` (:func:`add_time_limit`) and checks a :class:`Deadline` before each unit of work: work
  not started in time is reported as a skipped row that says so, never cut half-way;
- prints each row the moment it is measured, under its table's head (:class:`Printer`);
- turns a unit of work that raises into a failed row naming the error (:func:`attempt`), so the other rows are
  still measured, and frees what the row held (:func:`release`) before the next one starts.

    >>> printer = Printer()
    >>> emit = printer.table("| a | b |\\n|---|---|", lambda r: f"| {r['a']} | {r['b']} |")
    >>> emit({"a": 1, "b": 2})
    <BLANKLINE>
    | a | b |
    |---|---|
    | 1 | 2 |
    >>> Deadline(None).passed() is None
    True
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Deadline", "Printer", "add_time_limit", "attempt", "release", "first_line"]

Row = dict[str, Any]


class Deadline:
    """The script's own time limit: work not started before it is reported as skipped, not cut mid-way.

    >>> Deadline(0.0).passed()
    "not started: the script's time limit (0 s) was reached"
    """

    def __init__(self, seconds: float | None) -> None:
        self.at = None if seconds is None else time.perf_counter() + seconds
        self.seconds = seconds

    def passed(self) -> str | None:
        """Why the next unit of work must not start (the limit was reached), or None."""
        if self.at is not None and time.perf_counter() >= self.at:
            return f"not started: the script's time limit ({self.seconds:.0f} s) was reached"
        return None


def add_time_limit(parser: argparse.ArgumentParser) -> None:
    """``--time-limit S``: the suite passes each step its limit less the step's longest unit of work."""
    parser.add_argument("--time-limit", type=float, default=None, metavar="S", help="seconds; work not started by then is reported as skipped, not cut")


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, short enough for a table cell (``|`` replaced).

    >>> first_line(ValueError("bad shape\\nmore"))
    'ValueError: bad shape'
    """
    text = (str(error).strip().splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {text}".replace("|", "/")


def attempt(work: Callable[[], Row], device: torch.device) -> Row:
    """``work()``'s row with status ok, or, when it raises (out of memory, a kernel or compiler error), a failed row
    naming the error (its traceback on stderr), so that the other rows are still measured. What the row held is
    freed either way."""
    try:
        return {"status": "ok", **work()}
    except Exception as error:  # noqa: BLE001 - any failure of one row is that row's result
        traceback.print_exc()
        return {"status": "failed", "reason": first_line(error)}
    finally:
        release(device)


def release(device: torch.device) -> None:
    """Free what a finished row held before the next starts: compiled modules and engines hold each other in cycles,
    and dynamo's caches hold the compiled modules (a 1B model's weights and AdamW state are 20 GB)."""
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Printer:
    """Prints each row as it is done, under its table's head (a run killed at its limit still shows its rows); a
    second table's head is printed when its first row comes."""

    def __init__(self) -> None:
        self.head = ""

    def table(self, head: str, line: Callable[[Row], str]) -> Callable[[Row], None]:
        def emit(row: Row) -> None:
            if self.head != head:
                print(f"\n{head}", flush=True)
                self.head = head
            print(line(row), flush=True)

        return emit
