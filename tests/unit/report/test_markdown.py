"""Tests for the shared Markdown pieces: escaping, tables, code fences, plot links and sections, the atomic write."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ampkit._report.markdown import code_block, markdown_table, md_escape, plot_links, plot_section, table_cell, write_markdown


def _cells(line: str) -> list[str]:
    """A table row split at its unescaped pipes, as a Markdown renderer splits it."""
    cells, cell, escaped = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "|" and not escaped:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
        escaped = ch == "\\" and not escaped
    return cells + [cell.strip()]


def test_table_cell_keeps_a_value_in_its_cell() -> None:
    assert table_cell("a|b") == "a\\|b" and table_cell("c:\\x") == "c:\\\\x" and table_cell(" one\n two ") == "one two"
    assert table_cell("fc_1*2") == "fc_1*2"  # emphasis characters are left alone


def test_md_escape_escapes_emphasis_code_and_tags() -> None:
    assert md_escape("a|b_c*d`e") == "a\\|b\\_c\\*d\\`e"
    assert md_escape("<0.01%") == "<0.01%" and md_escape("<script>") == "\\<script>"
    assert md_escape(3) == "3"


@pytest.mark.parametrize("escape", [table_cell, md_escape])
def test_markdown_table_has_as_many_cells_per_row_as_headers(escape) -> None:
    lines = markdown_table(["Name", "Value"], [["head|out_proj", "1"], ["two\nlines", "2"]], escape=escape)
    assert lines[1] == "| --- | ---: |"  # default: first column left, figures right
    assert [len(_cells(line)) for line in lines] == [2, 2, 2, 2]
    assert lines[3].startswith("| two lines |")


def test_markdown_table_follows_justify() -> None:
    assert markdown_table(["a", "b", "c"], [], ["right", "left", "left"])[1] == "| ---: | --- | --- |"


def test_code_block_fence_outlasts_the_backticks_inside() -> None:
    assert code_block("ls", "sh") == ["```sh", "ls", "```"]
    fence, _, end = code_block("x ````` y")
    assert fence == end == "``````"


def test_plot_links_are_relative_escaped_and_skip_missing(tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    out = tmp_path / "out"
    (out / "figs").mkdir(parents=True)
    (out / "figs" / "time memory.png").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        links = plot_links(out, [Path("out/figs/time memory.png"), out / "gone.png"])
    assert links == [("time memory", "figs/time%20memory.png")]
    assert "gone.png" in caplog.text


def test_plot_section_escapes_titles_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "a_b.png").write_bytes(b"")
    (tmp_path / "x*y.png").write_bytes(b"")
    plots = [tmp_path / "a_b.png", tmp_path / "x*y.png"]
    assert plot_section(tmp_path, plots) == ["## Plots", "", "![a b](a_b.png)", "", "![x*y](x*y.png)", ""]
    assert plot_section(tmp_path, plots, escape=md_escape)[4] == "![x\\*y](x*y.png)"
    assert plot_section(tmp_path, [tmp_path / "gone.png"]) == []


def test_write_markdown_replaces_the_previous_page_whole(tmp_path: Path) -> None:
    path = tmp_path / "new" / "report.md"
    assert write_markdown(path, "# one\n") == path
    write_markdown(path, "# two · ✓\n")
    assert path.read_text(encoding="utf-8") == "# two · ✓\n"
    assert [p.name for p in path.parent.iterdir()] == ["report.md"]  # no temporary file left behind
