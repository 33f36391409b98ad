"""Tests for the plain-text tables: :class:`TableRows`, and the widths checked against a table rich draws."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console
from rich.table import Table

from ampkit._report.tables import TableRows, column_widths, table_width


def test_table_rows_is_a_frozen_record() -> None:
    rows = TableRows(headers=["a"], rows=[["1"]], justify=["right"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows.headers = ["b"]  # type: ignore[misc]


def test_column_widths_count_header_lines_and_terminal_cells() -> None:
    # A header is as wide as its longest line; '–' takes one cell, a CJK character two.
    assert column_widths(["Step time\n(p10–p90)", "名前"], [["1.0 ms", "x"]]) == [9, 4]
    assert column_widths(["Module"], []) == [6]


@pytest.mark.parametrize("cells", [[["bf16-mixed", "12.0 ms (11.9–12.3)"]], [["名前の長いモジュール", "1"]]])
def test_table_width_is_what_rich_draws(cells: list[list[str]]) -> None:
    headers = ["Precision", "Step time\n(p10–p90)"]
    table = Table()
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in cells:
        table.add_row(*row)
    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    top_border = console.file.getvalue().splitlines()[0]  # box characters: one terminal cell each
    assert table_width(column_widths(headers, cells)) == len(top_border)
