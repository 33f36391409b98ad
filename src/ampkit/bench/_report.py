"""report.md: a finished bench as a Markdown page that can be read on its own, pasted into an issue or a PR.

It holds what a reader needs to trust the figures: where and how they were taken (device, versions, the
exact command, the settings), the same results table as the terminal, the verdicts, the change to paste where a
policy pays (in the terms of the framework the model came from), each policy's memory by part, the plots, and a
short account of the measurement method.

    >>> import tempfile
    >>> from pathlib import Path
    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> result = BenchResult(workload="toy", command="ampkit bench toy", runs=[RunResult(precision="32-true")])
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     text = write_report(result, tmp).read_text()
    >>> text.splitlines()[0], "ampkit bench toy" in text
    ('# ampkit bench: toy', True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._report.markdown import (
    code_block,
    markdown_table,
    plot_links,
    plot_section,
    table_cell,
    write_markdown,
)
from ..memory._fp8_layers import Fp8Plan
from ._advice import closing_lines
from ._format import MISSING, fmt_bytes
from ._fp8_table import fp8_markdown
from ._plots import MEMORY_PARTS
from ._results import BenchResult, RunResult
from ._table import definitions, legend_lines, table_rows, tolerance_line, verdict_lines

__all__ = ["REPORT_NAME", "plot_links", "render_report", "write_report"]

REPORT_NAME = "report.md"

METHOD = """\
- Every policy starts from the same weights (one seed) and trains on the same batches in the same order, so the
  policies differ in precision only.
- Warm-up steps are run and discarded before timing: they hold one-off costs (allocation, kernel selection).
- Time is measured with the policies interleaved in rounds, the first one rotating each round, so that drift
  of the machine (clock boost, thermals, other load) spreads over every policy instead of favouring one.
  The table shows the median step time and its p10–p90 spread. The speed-up is the ratio of the medians; its
  95% interval (in the verdicts) is a bootstrap of the two samples of step times, and a speed-up whose interval
  holds 1.0 is called inconclusive, not a gain.
- The eval metric is held to 32-true's one way only (better is never a failure), within the larger of the
  tolerance and 32-true's eval noise: the 95% band of its figure from every eval batch scored alone. A policy
  better than 32-true beyond both shows training noise: the comparison is noisy, and a gap on the worse side no
  larger than that is unclear, not a loss.
- Memory: the peak is the most bytes of live tensors from the policy's setup through its first steps, with the
  micro-batch in use (each micro-batch is copied in as the step takes it, as from a loader): on CPU each storage
  counted exactly, the same count as `ampkit memory`'s peak; on CUDA, the caching allocator's peak. The parts
  (parameters, gradients, optimizer state, fp32 master weights, activations) are exact bytes; their sum need not
  be the peak, since gradients grow in backward while activations are freed. Activations are what autograd saves
  for backward in one micro-batch's forward: with `--accumulate K` each backward frees its micro-batch's graph
  before the next, so they are one micro-batch's. Each policy's memory is measured with that policy alone in the process.
- With `--compile`, each policy also trains compiled (`Engine(compile=...)`), in the same rounds as the others. Its
  first steps, where torch.compile traces and generates code, are taken while it is measured alone; their time
  less as many steady steps is its compile time, shown apart: no timed step includes it. A compiled twin's
  FLOPs are its eager twin's count (the same math).
- With `--accumulate K`, a step is one optimizer update over K micro-batches: its time and throughput count all K.
- FLOPs are counted by torch's `FlopCounterMode` on one training step (matmuls, convolutions, attention; every
  micro-batch; every process under DDP): forward and backward, about 3x the forward's, with a forward recomputed
  during backward (activation checkpointing) left out as work done twice. FLOP/s is that count over the median
  step time. MFU (on a GPU `ampkit/policy/_gpu_specs.py` lists) is the time those FLOPs would take at the GPU's
  dense peak for the format each ran in (fp8, bf16/fp16, TF32 or fp32, read op by op as the step runs) over the
  median step time; a figure above 100% is not shown: the row says the peak or the count is wrong.
"""


def _value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return fmt_bytes(value)
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"  # parameter counts: 1,048,576 reads at a glance, 1048576 does not
    if isinstance(value, (list, tuple)):
        return " × ".join(map(str, value)) if all(isinstance(v, int) for v in value) else ", ".join(map(str, value))
    return MISSING if value is None else str(value)


def _label(key: str) -> str:
    return key.removesuffix("_bytes").replace("_", " ")  # the value already says "GiB"


def _device_line(device: dict[str, Any]) -> str:
    if not device:
        return "unknown device"
    name = device.get("name") or device.get("type", "unknown")
    rest = [f"{_label(k)} {_value(k, v)}" for k, v in device.items() if k not in ("name", "type")]
    head = f"{name} ({device['type']})" if device.get("type") and device.get("type") != name else str(name)
    return head + (f", {', '.join(rest)}" if rest else "")


def _settings(title: str, values: dict[str, Any]) -> list[str]:
    if not values:
        return []
    return [f"**{title}:** " + ", ".join(f"{_label(k)} `{_value(k, v)}`" for k, v in values.items()), ""]


def _memory_section(runs: list[RunResult]) -> list[str]:
    runs = [r for r in runs if r.ok and (r.memory_breakdown or r.peak_memory_bytes is not None)]
    if not runs:
        return ["No memory figures were recorded.", ""]
    keys = [k for k in MEMORY_PARTS if any(k in r.memory_breakdown for r in runs)]
    keys += sorted({k for r in runs for k in r.memory_breakdown} - set(MEMORY_PARTS))
    # The counted total beside the peak shows what the peak holds beyond the training state (CUDA workspaces).
    total = ["counted total"] if keys else []
    headers = ["Precision", *(_label(k) for k in keys), *total, "peak memory"]
    rows = []
    for run in runs:
        parts = run.memory_breakdown
        counted = [fmt_bytes(sum(parts.values())) if parts else MISSING] if keys else []
        figures = [fmt_bytes(parts.get(k)) for k in keys]
        rows.append([run.label, *figures, *counted, fmt_bytes(run.peak_memory_bytes)])
    return markdown_table(headers, rows) + [""]


def _failures(runs: list[RunResult]) -> list[str]:
    lines: list[str] = []
    for run in runs:
        if run.error and len(run.error.strip().splitlines()) > 1:  # one-line errors are already whole in the table
            lines += [f"**{run.label}** ({run.status}):", "", *code_block(run.error.strip(), "text"), ""]
    return ["## Errors in full", "", *lines] if lines else []


def render_report(result: BenchResult, out_dir: str | os.PathLike[str] = ".", plots: list[Path] | None = None) -> str:
    """The text of report.md; plot links are made relative to ``out_dir``, where the report will live.

    ``plots`` are paths as :func:`ampkit.bench._plots.write_plots` returns them (see :func:`plot_links`).
    """
    out = Path(out_dir)
    lines = [f"# ampkit bench: {result.workload}", ""]
    if result.description:
        lines += [result.description, ""]
    facts = [f"**Device:** {_device_line(result.device)}"]
    facts += [f"{label} {value}" for label, value in (("torch", result.torch), ("ampkit", result.ampkit)) if value]
    facts += [f"date {result.date}"] if result.date else []
    lines += [" · ".join(facts), ""]
    if result.command:
        lines += ["Command:", "", *code_block(result.command, "sh"), ""]
    lines += _settings("Settings", result.settings) + _settings("Workload", result.workload_info)

    rows = table_rows(result)
    lines += ["## Results", "", *markdown_table(rows.headers, rows.rows, rows.justify), ""]
    lines += [f"Speed-up and memory saved are against `{result.reference}`; {MISSING} marks a figure not measured.", ""]
    lines += [*(f"{line}" for line in definitions(result)), ""]
    lines += ["## Verdicts", "", *(f"- {table_cell(v)}" for v in verdict_lines(result))]
    tolerance = tolerance_line(result)
    lines += ["", tolerance, ""] if tolerance else [""]
    lines += [table_cell(result.eval_noise), ""] if result.eval_noise else []
    lines += [result.recovery, ""] if result.recovery else []
    legend = legend_lines(result)
    lines += [f"**{legend[0]}**", "", *(f"- {table_cell(line)}" for line in legend[1:]), ""] if legend else []
    closing = closing_lines(result)
    lines += ["## What to paste", "", closing[0], "", *code_block("\n".join(closing[1:]), "python"), ""] if closing else []

    for name, plan in result.fp8_layers.items():
        lines += [f"## fp8 layers: {name}", "", fp8_markdown(Fp8Plan.from_dict(plan))]
    lines += ["## Memory by part", "", *_memory_section(result.runs)]
    lines += plot_section(out, plots)
    lines += _failures(result.runs)
    lines += ["## How this was measured", "", METHOD]
    return "\n".join(lines)


def write_report(result: BenchResult, out_dir: str | os.PathLike[str], plots: list[Path] | None = None) -> Path:
    """Write ``out_dir/report.md`` (the directory is created) atomically, and return its path.

    ``plots`` are the PNGs to embed (e.g. from :func:`ampkit.bench._plots.write_plots`); ones that do not exist
    are skipped with a warning rather than left as broken links.
    """
    out = Path(out_dir)
    return write_markdown(out / REPORT_NAME, render_report(result, out, plots))
