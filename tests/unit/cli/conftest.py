"""Shared by the CLI tests: reading a rich table back from captured output."""

from __future__ import annotations

from collections.abc import Callable

import pytest

Table = tuple[list[str], list[list[str]]]


def _cells(line: str, sep: str) -> list[str]:
    parts = line.strip().split(sep)
    return [p.strip() for p in parts[int(parts[0] == "") : len(parts) - int(parts[-1] == "")]]


def parse_table(text: str) -> Table:
    """The headers (a multi-line header joined with spaces) and the body lines, as cells, of the one rich table
    in ``text``. A row that wrapped comes back as two lines, a squeezed cell with its ellipsis."""
    head = [_cells(line, "┃") for line in text.splitlines() if "┃" in line]
    body = [_cells(line, "│") for line in text.splitlines() if "│" in line]
    return [" ".join(p for p in parts if p) for parts in zip(*head)], body


@pytest.fixture
def log_table(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Table]:
    """:func:`parse_table`, with ``COLUMNS`` unset so the captured stdout is a log with no width of its own."""
    monkeypatch.delenv("COLUMNS", raising=False)
    return parse_table
