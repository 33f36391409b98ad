"""Shared by the CLI tests: a refused command's error line, a user module of model and data factories, and
reading a rich table back from captured output."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from ampkit.cli._main import main

Table = tuple[list[str], list[list[str]]]

USER = """
import sys
import torch
from torch import nn
from ampkit.bench import BenchData

def model():
    torch.manual_seed(0)
    return nn.Linear(8, 3)

def exiting_model():
    sys.exit(0)

def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]

def data():
    return _batches(4)

def failing_generator():
    for i, batch in enumerate(_batches(4)):
        if i == 2:
            raise OSError("shard 2 is unreadable")
        yield batch

def exiting_generator():
    yield from _batches(1)
    raise SystemExit(0)

def eval_five():
    return BenchData(train=_batches(4), eval=5)
"""
"""A user's module of factories for --model/--data: good ones, and ones that exit or fail partway."""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a fresh, importable module holding :data:`USER`'s factories (``--model {user}:model``)."""
    (tmp_path / "cli_user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cli_user", raising=False)  # imported afresh: a test may check it was not
    return "cli_user"


@pytest.fixture
def cli_error(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], str]:
    """Run ``ampkit ARGV`` expecting a refusal: exit code 2, one ``ampkit: error:`` line (returned) and no
    traceback on stderr, nothing run."""

    def error(argv: list[str]) -> str:
        assert main(argv) == 2
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert err.startswith("ampkit: error: ") and "\n" not in err and "Traceback" not in err
        assert "Status" not in captured.out  # refused before any run
        return err

    return error


def _cells(line: str, sep: str) -> list[str]:
    parts = line.strip().split(sep)
    return [p.strip() for p in parts[int(parts[0] == "") : len(parts) - int(parts[-1] == "")]]


def parse_table(text: str, index: int = 0) -> Table:
    """The headers (a multi-line header joined with spaces) and the body lines, as cells, of the ``index``-th rich
    table in ``text``. A row that wrapped comes back as two lines, a squeezed cell with its ellipsis."""
    tables, lines = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("┏"):  # a table's top border: the lines before it belong to the last one
            lines = []
            tables.append(lines)
        lines.append(line)
    table = tables[index] if tables else text.splitlines()  # a box with no top border: the one table
    head = [_cells(line, "┃") for line in table if "┃" in line]
    body = [_cells(line, "│") for line in table if "│" in line]
    return [" ".join(p for p in parts if p) for parts in zip(*head)], body


@pytest.fixture
def log_table(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Table]:
    """:func:`parse_table`, with ``COLUMNS`` unset so the captured stdout is a log with no width of its own."""
    monkeypatch.delenv("COLUMNS", raising=False)
    return parse_table
