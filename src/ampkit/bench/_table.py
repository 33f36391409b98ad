"""The terminal table of a finished bench: one row per policy, every figure side by side, then the verdicts.

The columns are defined once here (:func:`table_rows`) and reused by report.md, so the terminal and the
report always show the same figures. Optional columns (peak RSS, eval metric, MFU, notes) appear only when
at least one run has the figure, which keeps the table narrow on CPUs and throughput-only workloads.

    >>> import io
    >>> from rich.console import Console
    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> result = BenchResult(workload="toy", runs=[RunResult(precision="32-true", step_time_median_s=0.012)])
    >>> console = Console(file=io.StringIO(), width=200)
    >>> render(result, console)
    >>> "12.0 ms" in console.file.getvalue()
    True
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from .._report.tables import TableRows, column_widths, table_width
from ..memory._fp8_layers import Fp8Plan
from ._format import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_flops,
    fmt_number,
    fmt_percent,
    fmt_ratio,
    fmt_seconds,
)
from ._fp8_table import print_fp8_table
from ._quality import QUALITY, metric_words
from ._results import BenchResult, RunResult
from ._verdict import PAYS_SPEEDUP, SAME_SPEED, VERDICTS

__all__ = [
    "TableRows", "build_table", "definitions", "legend_lines", "render", "run_notes", "table_rows", "tolerance_line",
    "verdict_lines",
]

log = logging.getLogger("ampkit")

NOTE_CHARS = 160
"""Errors are cut to their first line and this many characters in the table; report.md keeps them whole."""
NOTES_MIN_WIDTH = 24
"""Narrowest the notes column may wrap to before the table is turned on its side instead."""

_STATUS_STYLE = {"ok": "green", "diverged": "bold red", "failed": "red", "unsupported": "dim"}
_ROW_STYLE = {"diverged": "red", "failed": "dim", "unsupported": "dim"}


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[RunResult], str]
    figure: bool = True
    """A measured figure: shown as a dash for runs that produced none (failed or unsupported)."""
    justify: str = "right"
    style: Callable[[RunResult], str | None] | None = None


def first_non_finite_step(run: RunResult) -> int | None:
    """The 1-based step whose loss was first inf, NaN or missing (NaN becomes null in results.json)."""
    for step, loss in enumerate(run.losses, start=1):
        if loss is None or not math.isfinite(loss):
            return step
    return None


def run_notes(run: RunResult, *, limit: int | None = NOTE_CHARS) -> str:
    """What the row cannot say in figures: the error of a failed run, where a diverged run's loss broke, why no MFU."""
    if run.error:
        text = run.error.strip()
        if limit is not None:
            text = text.splitlines()[0] if text else text
            text = text if len(text) <= limit else text[: limit - 1] + "…"
        return text
    notes = []
    if run.status == "diverged":
        step = first_non_finite_step(run)
        notes.append(f"loss not finite from step {step}" if step else "loss diverged")
    if run.compiling_steps:
        held = "every timed step compiled: the step time holds compilation" if run.compiling_steps >= run.timed_steps else (
            f"{run.compiling_steps} step(s) after the warm-up compiled: left out of the step time"
        )
        notes.append(f"{held} (raise --warmup)")
    why = _no_mfu(run)
    return "; ".join(notes + ([why] if why else []))


def _no_mfu(run: RunResult) -> str | None:
    """Why the MFU cell holds no figure; an MFU above 100% (a results.json from before the check) is one reason."""
    if run.mfu is not None and run.mfu > 1.0:
        return f"MFU n/a: {run.mfu:.0%} recorded, above the GPU's dense peak: a wrong peak or FLOP count"
    return run.mfu_note


def _mfu_cell(run: RunResult) -> str:
    if _no_mfu(run):
        return "n/a"  # the Notes column says why
    return fmt_percent(run.mfu)


def definitions(result: BenchResult) -> list[str]:
    """What the memory and MFU columns measure, printed under the table (and in report.md)."""
    if result.device.get("type") == "cuda":
        peak = "torch.cuda.max_memory_allocated"
    else:
        peak = "the most bytes of live tensors (ampkit memory's peak, each storage once)"
    lines = [
        (f"Peak memory: {peak} from the policy's setup through its first steps, with the micro-batch in use. "
         "Activations: saved for backward by one micro-batch (accumulated micro-batches free theirs in turn).")
    ]
    if result.device.get("type") != "cuda" and any(r.compile is not None and r.ok for r in result.runs):
        lines.append("Compiled runs on the CPU have no peak: nothing counts the tensors inside compiled code.")
    if _has_mfu(result):
        lines.append(
            "MFU: the time the step's useful FLOPs (forward and backward, recomputation excluded) would take at the GPU's "
            "dense peak for the format each ran in (fp8, bf16/fp16, TF32 or fp32), over the median step time."
        )
    return lines


def _has_mfu(result: BenchResult) -> bool:
    return any(r.mfu is not None or r.mfu_note for r in result.runs)


def _step_time(run: RunResult) -> str:
    median = fmt_seconds(run.step_time_median_s)
    if run.step_time_p10_s is None or run.step_time_p90_s is None or median == MISSING:
        return median
    return f"{median} ({fmt_seconds(run.step_time_p10_s, unit=False)}–{fmt_seconds(run.step_time_p90_s, unit=False)})"


_MARKS = ("better", "unclear", "worse")
"""The :data:`~ampkit.bench._quality.QUALITY` words an eval cell carries after its figure ("as good" goes unmarked)."""
_MARK_STYLE = {"worse": "red", "unclear": "yellow"}


def _mark(run: RunResult) -> str | None:
    if run.quality in _MARKS:
        return run.quality
    # A results.json older than the quality field: only its one-sided "outside" is known.
    return "worse" if run.quality is None and run.within_tolerance is False else None


def _eval_header(name: str | None) -> str:
    """``Eval accuracy``, ``Eval perplexity``, ``Eval loss`` (not ``Eval eval_loss``), or ``Eval`` when runs disagree."""
    return "Eval " + metric_words(name).removeprefix("eval ") if name else "Eval"


def _eval_cell(name: str | None) -> Callable[[RunResult], str]:
    def cell(run: RunResult) -> str:
        value = fmt_float(run.eval_metric)
        if name is None and run.eval_metric_name:  # runs disagree on the metric: say which one this is
            value = f"{metric_words(run.eval_metric_name)} {value}"
        mark = _mark(run)
        return f"{value} {mark}" if mark and value != MISSING else value  # legend_lines defines the mark

    return cell


def _speedup_style(run: RunResult) -> str | None:
    if run.speedup_vs_fp32 is None or math.isnan(run.speedup_vs_fp32):
        return None
    # The verdict's own thresholds and noise rule, so the colour never contradicts the words below the table:
    # a speed-up whose interval holds 1.0 is not coloured at all.
    if run.speedup_vs_fp32 >= PAYS_SPEEDUP and run.speedup_low is not None and run.speedup_low > 1.0:
        return "green"
    slower = run.speedup_vs_fp32 < 1.0 - SAME_SPEED and run.speedup_high is not None and run.speedup_high < 1.0
    return "yellow" if slower else None


def _status_style(run: RunResult) -> str | None:
    return _STATUS_STYLE.get(run.status)


def _columns(result: BenchResult) -> list[_Column]:
    runs = result.runs
    names = {r.eval_metric_name for r in runs if r.eval_metric_name}
    metric = next(iter(names)) if len(names) == 1 else None
    cols = [
        _Column("Precision", lambda r: r.label, figure=False, justify="left"),
        _Column("Status", lambda r: r.status, figure=False, justify="left", style=_status_style),
        _Column("Step time\n(p10–p90)", _step_time),
        _Column("Throughput", lambda r: fmt_number(r.throughput, f"{r.throughput_unit}/s")),
        _Column(f"Speed-up\nvs {result.reference}", lambda r: fmt_ratio(r.speedup_vs_fp32), style=_speedup_style),
    ]
    if any(r.compile is not None for r in runs):  # --compile: the twin's gain over eager, and what compiling cost
        cols += [
            _Column("Speed-up\nvs eager", lambda r: fmt_ratio(r.speedup_vs_eager)),
            # Seconds, not the step column's milliseconds: compiling takes seconds to minutes.
            _Column("Compile\ntime", lambda r: MISSING if r.compile_time_s is None else f"{r.compile_time_s:.1f} s"),
        ]
    cols += [
        _Column("Peak\nmemory", lambda r: fmt_bytes(r.peak_memory_bytes)),
        _Column("Activations", lambda r: fmt_bytes(r.activation_bytes)),
    ]
    if any(r.peak_rss_bytes is not None for r in runs):
        cols.append(_Column("Peak RSS", lambda r: fmt_bytes(r.peak_rss_bytes)))
    cols += [
        _Column("Memory\nsaved", lambda r: fmt_percent(r.memory_saved_vs_fp32)),
        _Column("Final\nloss", lambda r: fmt_float(r.final_loss)),
    ]
    if names:
        cols.append(_Column(_eval_header(metric), _eval_cell(metric), style=lambda r: _MARK_STYLE.get(_mark(r) or "")))
    cols += [
        _Column("Skipped\nsteps", lambda r: str(r.skipped_steps)),
        _Column("Loss\nscale", lambda r: fmt_float(r.final_loss_scale, 8)),  # powers of two up to 2^26 in full
        _Column("FLOP/s", lambda r: fmt_flops(r.achieved_flops)),
    ]
    if _has_mfu(result):
        cols.append(_Column("MFU", _mfu_cell))
    if any(run_notes(r) for r in runs):
        cols.append(_Column("Notes", run_notes, figure=False, justify="left"))
    return cols


def _cell(col: _Column, run: RunResult) -> str:
    # A failed run may have filled a figure or two before it broke (FLOPs are counted first); a half-measured
    # figure next to "failed" would read as a result, so every figure of a run without results is a dash.
    return MISSING if col.figure and not run.ok else col.cell(run)


def _cell_style(col: _Column, run: RunResult) -> str:
    if col.style is None or (col.figure and not run.ok):
        return ""
    return col.style(run) or ""


def table_rows(result: BenchResult) -> TableRows:
    """Headers and plain-text cells of the results table, one row per run in ``result.runs`` order.

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> rows = table_rows(BenchResult(workload="w", runs=[RunResult(precision="bf16-mixed", speedup_vs_fp32=1.5)]))
    >>> rows.headers[:2], rows.rows[0][:2], rows.rows[0][rows.headers.index("Speed-up vs 32-true")]
    (['Precision', 'Status'], ['bf16-mixed', 'ok'], '1.50x')
    """
    cols = _columns(result)
    return TableRows(
        headers=[c.header.replace("\n", " ") for c in cols],
        rows=[[_cell(c, r) for c in cols] for r in result.runs],
        justify=[c.justify for c in cols],
    )


def build_table(result: BenchResult, *, transpose: bool = False) -> Table:
    """The rich :class:`~rich.table.Table` :func:`render` prints; a diverged run is red, a failed one dim.

    ``transpose=True`` gives one column per run and one row per figure, which fits a narrow terminal.
    """
    cols = _columns(result)
    table = Table(title=f"ampkit bench: {result.workload}", title_justify="left", header_style="bold")
    if transpose:
        table.add_column("")
        for run in result.runs:
            table.add_column(run.label, justify="right", style=_ROW_STYLE.get(run.status))
        for col in cols[1:]:
            justify = "left" if col.header == "Notes" else None  # prose reads from the left, figures line up right
            cells = (Text(_cell(col, r), style=_cell_style(col, r), justify=justify) for r in result.runs)
            table.add_row(col.header.replace("\n", " "), *cells, end_section=col.header == "Status")
        return table
    for col in cols:
        # Error text may be long: it wraps inside its own column, each figure keeps to one line.
        notes = col.header == "Notes"
        table.add_column(
            col.header, justify=col.justify, no_wrap=not notes, min_width=NOTES_MIN_WIDTH if notes else None  # type: ignore[arg-type]
        )
    for run in result.runs:
        cells = (Text(_cell(c, run), style=_cell_style(c, run)) for c in cols)
        table.add_row(*cells, style=_ROW_STYLE.get(run.status))
    return table


def _wide_width(result: BenchResult) -> int:
    """Columns the one-row-per-run table needs with every figure on one line (the notes may wrap)."""
    cols = _columns(result)
    widths = column_widths([c.header for c in cols], [[_cell(c, r) for c in cols] for r in result.runs])
    return table_width([min(w, NOTES_MIN_WIDTH) if c.header == "Notes" else w for c, w in zip(cols, widths)])


def verdict_lines(result: BenchResult) -> list[str]:
    """One line per run: its verdict, or, when the runner left none, its status (and error).

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> runs = [RunResult(precision="32-true", verdict="32-true: the fp32 reference"),
    ...         RunResult(precision="bf16-true", status="failed", error="RuntimeError: boom\\nTraceback ...")]
    >>> verdict_lines(BenchResult(workload="w", runs=runs))
    ['32-true: the fp32 reference', 'bf16-true: failed: RuntimeError: boom']
    """
    lines = []
    for run in result.runs:
        if run.verdict:
            # The runner's verdicts already start with the policy; a hand-written one may not.
            text = run.verdict if run.verdict.startswith(run.label) else f"{run.label}: {run.verdict}"
        elif not run.ok:
            text = f"{run.label}: {run.status}" + (f": {run_notes(run)}" if run.error else "")
        else:
            text = f"{run.label}: {run.status}, no verdict"
        lines.append(text)
    return lines


def tolerance_line(result: BenchResult) -> str | None:
    """The eval tolerance in words, or None for a workload without an eval metric.

    >>> from ampkit.bench._results import BenchResult
    >>> tolerance_line(BenchResult(workload="w", eval_tolerance="accuracy within 0.02 of 32-true"))
    'Eval tolerance: accuracy within 0.02 of 32-true.'
    """
    return f"Eval tolerance: {result.eval_tolerance}." if result.eval_tolerance else None


def legend_lines(result: BenchResult) -> list[str]:
    """What each verdict word and eval mark that ``result`` prints means: its one definition, printed with it.

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> runs = [RunResult(precision="bf16-true", outcome="does not pay", quality="worse")]
    >>> for line in legend_lines(BenchResult(workload="w", runs=runs)): print(line)
    What the words mean:
    does not pay: the loss diverged, or its eval metric is worse than 32-true's beyond the tolerance, the eval noise and the run's spread, or no gain in speed or memory was measured.
    worse (after an eval figure): worse than 32-true beyond the tolerance, the eval noise and the run's spread: quality is lost.
    """
    words = [w for w in VERDICTS if any(r.outcome == w for r in result.runs)]
    marks = [m for m in _MARKS if any(_mark(r) == m and r.ok for r in result.runs)]
    lines = [f"{w}: {VERDICTS[w]}." for w in words] + [f"{m} (after an eval figure): {QUALITY[m]}." for m in marks]
    return ["What the words mean:", *lines] if lines else []


def render(result: BenchResult, console: Console, *, transpose: bool | None = None) -> None:
    """Print the results table of ``result``, then each run's verdict and the eval tolerance, to ``console``.

    ``transpose`` None picks the layout: one row per run when that fits the console, else one column per run.
    """
    if not result.runs:
        log.warning("bench result for %s has no runs to show", result.workload)
    verdicts = Text()
    for line, run in zip(verdict_lines(result), result.runs):
        verdicts.append(f"{line}\n", style=_ROW_STYLE.get(run.status, ""))
    tolerance = tolerance_line(result)
    if tolerance:
        verdicts.append(f"{tolerance}\n", style="dim")
    if result.eval_noise:
        verdicts.append(f"{result.eval_noise}\n", style="dim")
    if result.recovery:
        verdicts.append(f"{result.recovery}\n")
    for line in [*legend_lines(result), *definitions(result)]:
        verdicts.append(f"{line}\n", style="dim")
    verdicts.rstrip()
    table = build_table(result)
    # Squeezed by rich, a 15-column table truncates every figure; turned on its side it stays readable.
    if transpose or (transpose is None and _wide_width(result) > console.width):
        table = build_table(result, transpose=True)
    # Wrapped verdicts keep the indent; not expanded, so a wide console (a log) gets no trailing spaces.
    console.print(Group(table, Text(), Padding(verdicts, (0, 0, 0, 2), expand=False)))
    for plan in result.fp8_layers.values():  # which Linear layers the fp8 runs multiplied in fp8, and why
        print_fp8_table(Fp8Plan.from_dict(plan), console)
