"""Tables as plain strings, the form both a terminal table (rich) and a report.md table (Markdown) are built from,
and the widths a terminal table needs to keep every figure on one line.

A tool defines its columns once and turns them into :class:`TableRows`; the terminal and the report then show the
same cells and cannot disagree.

    >>> rows = TableRows(headers=["Precision", "Step time"], rows=[["bf16-mixed", "12.0 ms"]], justify=["left", "right"])
    >>> widths = column_widths(["Precision", "Step time\\n(p10–p90)"], rows.rows)
    >>> widths, table_width(widths)
    ([10, 9], 26)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TableRows", "column_widths", "table_width"]


@dataclass(frozen=True)
class TableRows:
    """The table as plain strings: what report.md turns into Markdown and a tool's ``build_table`` into rich.

    >>> TableRows(headers=["Module"], rows=[["fc"]], justify=["left"]).rows
    [['fc']]
    """

    headers: list[str]
    rows: list[list[str]]
    justify: list[str]
    """``left`` or ``right`` per column (figures are right-aligned so digits line up)."""


def column_widths(headers: list[str], rows: list[list[str]]) -> list[int]:
    """Terminal cells each column needs: its longest header line (headers break at ``\\n``) or cell.

    >>> column_widths(["Grad range\\n(bits)", "Notes"], [["12.5", "loss not finite"]])
    [10, 15]
    """
    # rich counts the cells a character takes on a terminal (wide CJK, emoji); imported here so that importing
    # this module does not load rich for a tool that only writes Markdown.
    from rich.cells import cell_len

    return [max(cell_len(t) for t in [*h.split("\n"), *(r[i] for r in rows)]) for i, h in enumerate(headers)]


def table_width(widths: list[int]) -> int:
    """Terminal columns a rich table of these column widths takes: a border and padding either side of each.

    >>> table_width([10, 9])
    26
    """
    return 1 + sum(w + 3 for w in widths)
