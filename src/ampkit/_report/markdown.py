"""Markdown for the tools' report.md pages: escaping, tables, code blocks, plot links, and the atomic write.

A report.md is read on its own, or pasted into an issue or a PR, so every piece here keeps a value from changing
the page's structure: a ``|`` in a cell would start a new column, a backtick in a command would end its code
block, a space in an image link would end the link.

    >>> print("\\n".join(markdown_table(["Policy", "Speed-up"], [["bf16|mixed", "1.50x"]])))
    | Policy | Speed-up |
    | --- | ---: |
    | bf16\\|mixed | 1.50x |
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..fileio._atomic import write_text_atomic

__all__ = ["table_cell", "md_escape", "markdown_table", "code_block", "plot_links", "plot_section", "write_markdown"]

log = logging.getLogger("ampkit")

# Only what changes meaning mid-line: emphasis, code, links, table cells, strike-through, and '<' opening a tag.
_SPECIAL = re.compile(r"([\\`*_\[\]|~]|<(?=[A-Za-z/!?]))")


def table_cell(text: str) -> str:
    r"""``text`` safe inside a Markdown table cell and nothing more: pipes and backslashes escaped, on one line.

    Emphasis is left alone (a figure like ``2*3`` or a name like ``fc_1`` reads the same either way).

    >>> table_cell("a|b\nc"), table_cell("fc_1")
    ('a\\|b c', 'fc_1')
    """
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


def md_escape(text: object) -> str:
    r"""``text`` with Markdown's special characters escaped and on one line: safe in prose and table cells.

    A ``|`` would start a new table column, ``_`` or ``*`` in a module name could start emphasis.

    >>> md_escape("head|out_proj"), md_escape("a\nb")
    ('head\\|out\\_proj', 'a b')
    """
    return " ".join(_SPECIAL.sub(r"\\\1", str(text)).split())


def markdown_table(
    headers: list[str],
    rows: Iterable[list[str]],
    justify: list[str] | None = None,
    *,
    escape: Callable[[str], str] = table_cell,
) -> list[str]:
    """The lines of a Markdown table; ``justify`` is ``left`` or ``right`` per column (default: the first column
    left, figures right), every header and cell passed through ``escape``.

    >>> markdown_table(["Module", "Share"], [["fc_1", "3%"]], ["left", "right"], escape=md_escape)
    ['| Module | Share |', '| --- | ---: |', '| fc\\\\_1 | 3% |']
    """
    justify = justify or ["left"] + ["right"] * (len(headers) - 1)
    lines = ["| " + " | ".join(escape(h) for h in headers) + " |"]
    lines.append("| " + " | ".join("---:" if j == "right" else "---" for j in justify) + " |")
    return lines + ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]


def code_block(text: str, language: str = "") -> list[str]:
    """The lines of a fenced code block holding ``text``.

    >>> code_block("echo ```", "sh")
    ['````sh', 'echo ```', '````']
    """
    # The fence must be longer than any run of backticks inside, or a quoted command would end the block early.
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{language}", text, fence]


def plot_links(out_dir: str | os.PathLike[str], plots: Iterable[str | os.PathLike[str]] | None) -> list[tuple[str, str]]:
    """(title, link) of every plot that exists, the link relative to ``out_dir`` where report.md lives.

    A plot path is an ordinary path, absolute or relative to the current directory, as the tools' ``write_plots``
    return it: ``runs/toy/loss_curves.png`` with ``out_dir`` ``runs/toy`` links ``loss_curves.png``. A plot that
    does not exist is skipped with a warning rather than left as a broken link. Spaces in the link are escaped,
    or Markdown would end it there.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "loss_curves.png").write_bytes(b"")
    ...     plot_links(tmp, [Path(tmp) / "loss_curves.png"])
    [('loss curves', 'loss_curves.png')]
    """
    links = []
    for path in (Path(p) for p in plots or []):
        if not path.exists():
            log.warning("report.md: plot %s does not exist; not linking it", path)
            continue
        link = Path(os.path.relpath(path, out_dir)).as_posix().replace(" ", "%20")
        links.append((path.stem.replace("_", " "), link))
    return links


def plot_section(
    out_dir: str | os.PathLike[str],
    plots: Iterable[str | os.PathLike[str]] | None,
    *,
    escape: Callable[[str], str] = str,
) -> list[str]:
    """A ``## Plots`` section embedding each of :func:`plot_links`; no lines at all when no plot exists.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "time_memory.png").write_bytes(b"")
    ...     plot_section(tmp, [Path(tmp) / "time_memory.png"]), plot_section(tmp, [])
    (['## Plots', '', '![time memory](time_memory.png)', ''], [])
    """
    lines = []
    for title, link in plot_links(out_dir, plots):
        lines += [f"![{escape(title)}]({link})", ""]
    return ["## Plots", "", *lines] if lines else []


def write_markdown(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (its directory is created) and return the path.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_markdown(Path(tmp) / "out" / "report.md", "# title").read_text()
    '# title'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    log.info("wrote %s", path)
    return path
