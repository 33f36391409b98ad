"""report.md: a profile as a Markdown page to read on its own, or paste into an issue or a PR.

It says what ran and where (the command, machine, torch, date), where the step's time goes, the host syncs and the
lines that make them, the op shares, what each input-pipeline trial measured, the advice, the pictures, the Chrome
trace and what profiling itself cost. The rows and sentences are those of the terminal (:mod:`ampkit.profile._table`),
so the two never disagree.

    >>> import tempfile
    >>> data = {"workload": {"name": "toy"}, "command": "ampkit profile -w toy",
    ...         "phases": {"data": {"median_s": 0.15, "share": 0.75}, "forward": {"median_s": 0.05, "share": 0.25}}}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     text = write_report(data, Path(tmp), []).read_text()
    >>> text.splitlines()[0], "| data | 150 ms | 75.0% |" in text
    ('# ampkit profile: toy', True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._report.markdown import (
    code_block,
    markdown_table,
    md_escape,
    plot_section,
    write_markdown,
)
from .._report.tables import TableRows
from ._disturbed import disturbed_line
from ._table import (
    advice_parts,
    header_lines,
    idle_line,
    ops_lines,
    overhead_line,
    phase_rows,
    sentence,
    sync_line,
    sync_rows,
    trial_rows,
)

__all__ = ["REPORT_NAME", "render_report", "write_report"]

REPORT_NAME = "report.md"

HOW_TO_READ = """\
- Each figure is the median over the measured steps; the warm-up steps before them (allocation, kernel selection)
  are not measured. A phase's share is of the median step.
- The phases are timed at the engine's step hooks. On CUDA the host only queues kernels, so the phases are read
  from CUDA events recorded at the same moments, and **device idle** is the share of the step in which the GPU ran
  no kernel: time the step spent waiting on the host.
- A **host sync** is a read of device values back to the host (`.item()`, `float(t)`, printing a tensor, `if t:`).
  On a GPU each one waits for every queued kernel to finish; on a CPU it is still the place a GPU run would stall.
- The **cast share** is the share of forward and backward time spent in autocast's casts, read from torch.profiler;
  compile or a policy with 16-bit weights can remove them (bench measures by how much).
- Each **trial** re-ran the same step fed by the DataLoader with the settings its name gives (the data, order and
  batches unchanged). Its step is the step as trained: the steady steps' mean, plus what an epoch's start costs
  beyond them spread over the loader's epoch; its speed-up is the baseline's step over its own.
- The **profiler overhead** is each measuring window's median step (phases timed; syncs counted; torch.profiler)
  against the plain window's, steps of the same run with nothing measured but their end. Measuring only adds to a
  step: a window faster than the plain step by more than the timed steps' p10-p90 spread means the plain steps
  were disturbed, and is reported so instead of as a ratio.
- A **disturbed** run is one during which other processes took at least half a core of CPU time (the measure
  `ampkit tune` reads, from the kernel's counters; the loop's own DataLoader workers count as its own): its
  figures are slowed by them, and the report says so above them instead of presenting them as the loop's own.
"""


def _md_table(rows: TableRows, code: tuple[str, ...] = ()) -> list[str]:
    """``rows`` as Markdown: the terminal's broken headers joined, the ``code`` columns as inline code."""
    columns = [i for i, h in enumerate(rows.headers) if h in code]
    cells = [[_inline_code(c) if i in columns else md_escape(c) for i, c in enumerate(row)] for row in rows.rows]
    return markdown_table([h.replace("\n", " ") for h in rows.headers], cells, rows.justify, escape=lambda s: s)


def _inline_code(text: str) -> str:
    text = " ".join(text.split())
    if not text or "`" in text:
        return md_escape(text)  # a backtick would end the span early; escaped prose reads the same
    return "`" + text.replace("|", "\\|") + "`"  # in a table even a code span's pipe starts a new cell


def _what_ran(data: dict[str, Any]) -> list[str]:
    title, *rest = header_lines(data)
    description, settings = rest[:-1], rest[-1]  # header_lines ends with the device/precision/steps line
    lines = [f"# {md_escape(title)}", "", *(md_escape(d) for d in description), *([""] if description else [])]
    facts = [f"{key} {md_escape(data[field])}" for key, field in (("torch", "torch"), ("ampkit", "ampkit_version"), ("date", "date")) if data.get(field)]
    lines += [" · ".join([md_escape(settings), *facts]), ""]
    warning = disturbed_line(data)
    lines += [f"**{md_escape(warning)}**", ""] if warning else []
    if data.get("command"):
        lines += ["Command:", "", *code_block(str(data["command"]), "sh"), ""]
    return lines


def _phases(data: dict[str, Any]) -> list[str]:
    rows = phase_rows(data)
    lines = ["## Where the step's time goes", ""]
    lines += [*_md_table(rows), ""] if rows.rows else ["No phase times were recorded.", ""]
    idle = idle_line(data)
    return lines + ([md_escape(idle), ""] if idle else [])


def _syncs(data: dict[str, Any]) -> list[str]:
    line = sync_line(data)
    if not line:
        return []
    rows = sync_rows(data, top=None)
    return ["## Host syncs", "", md_escape(line), "", *([*_md_table(rows, code=("Code",)), ""] if rows.rows else [])]


def _ops(data: dict[str, Any]) -> list[str]:
    lines = ops_lines(data)
    return ["## Op shares", "", *(f"- {md_escape(line)}" for line in lines), ""] if lines else []


def _trials(data: dict[str, Any]) -> list[str]:
    rows = trial_rows(data)
    note = [md_escape(sentence(data["trials_note"])), ""] if data.get("trials_note") else []
    if not rows.rows:
        return ["## Input-pipeline trials", "", *note] if note else []
    return ["## Input-pipeline trials", "", *_md_table(rows), "", *note]


def _advice(data: dict[str, Any]) -> list[str]:
    advice = data.get("advice") or []
    if not advice:
        return []
    lines = ["## Advice", ""]
    for number, item in enumerate(advice, start=1):
        (topic, finding), *rest = advice_parts(item)
        lines.append(f"{number}. **{md_escape(topic)}:** {md_escape(finding)}")
        lines += [f"   - {label}: " + (_inline_code(text) if label == "confirm with" else md_escape(text)) for label, text in rest]
    return lines + [""]


def _trace(data: dict[str, Any], out: Path) -> list[str]:
    trace = data.get("trace")
    if not trace:
        return []
    path = Path(trace)
    # profile.json names the trace beside it (relative to the output directory); an absolute one is linked from here.
    link = Path(os.path.relpath(path, out)).as_posix() if path.is_absolute() else path.as_posix()
    name = md_escape(path.name)
    return ["## Chrome trace", "", f"[{name}]({link.replace(' ', '%20')}): open it in <https://ui.perfetto.dev> or `chrome://tracing`.", ""]


def render_report(data: dict[str, Any], out_dir: str | os.PathLike[str] = ".", plots: list[Path] | None = None) -> str:
    """The text of report.md for the profile ``data``; plot and trace links are relative to ``out_dir``.

    ``plots`` are paths as :func:`ampkit.profile._plots.write_plots` returns them, absolute or relative to the
    current directory (see :func:`ampkit._report.markdown.plot_links`).
    """
    out = Path(out_dir)
    lines = _what_ran(data) + _phases(data) + _syncs(data) + _ops(data) + _trials(data) + _advice(data)
    lines += plot_section(out, plots, escape=md_escape) + _trace(data, out)
    overhead = overhead_line(data)
    lines += ["## Profiler overhead", "", md_escape(overhead), ""] if overhead else []
    return "\n".join(lines + ["## How to read this", "", HOW_TO_READ])


def write_report(data: dict[str, Any], out: Path, plots: list[Path] | None = None) -> Path:
    """Write ``out/report.md`` (the directory is created) atomically and return its path.

    ``plots`` are the PNGs to embed (from :func:`ampkit.profile._plots.write_plots`); missing ones are skipped with
    a warning rather than left as broken links.
    """
    out = Path(out)
    return write_markdown(out / REPORT_NAME, render_report(data, out, plots))
