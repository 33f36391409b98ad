"""The answer of a tune, as people read it: the ranked table with every column defined where it is printed, the
winner as code to paste, what was pruned or not tried and why; on the terminal, in ``report.md`` and ``tune.json``.

Each figure has one definition (:data:`COLUMNS`, printed under the table), and each verdict one meaning
(:data:`VERDICTS`, printed under the table for the words used):

    >>> sorted(VERDICTS)
    ['cut', 'disturbed', 'failed', 'faster', 'no gain', 'rejected', 'slower', 'start', 'winner']
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._report.dialect import AS_GIVEN, Advice, paste_code
from .._report.markdown import plot_links
from ._format import fmt_bytes
from ._mfu import row_mfu
from ._space import Candidate

if TYPE_CHECKING:
    from rich.console import Console

    from ._result import TuneResult

__all__ = ["COLUMNS", "PLOTS", "VERDICTS", "advice", "code", "machine_line", "render", "rows", "write_report"]

COLUMNS: dict[str, str] = {
    "configuration": "what differs from the start (fp32, your batch, eager, torch's threads, your memory format)",
    "throughput": "{unit} per second of the global batch at the median optimizer step, compile time amortised over "
    "{run_steps} steps (--run-steps); the data already in memory (a DataLoader's trials, where tuned, are listed apart)",
    "start then": "the start's throughput measured in the same interleaved rounds as this row: the speed-up's control "
    "(each stage's rounds run at another time, and the machine's speed moves between them)",
    "speed-up": "the start's median step in the same rounds over this one's (amortised); in brackets its 95% "
    "bootstrap interval; a finalist's from the confirmation wave (the finalists measured again beside the start, the "
    "figure they were ranked by, not the one their stage selected them on)",
    "MFU": "model FLOPs utilisation, ampkit bench's definition: the time one optimizer step's useful FLOPs (forward "
    "and backward as torch's FlopCounterMode counts them, on the configuration's eager step; a recomputed forward "
    "left out) would take at the device's dense peak for each format they ran in, over the median step (compile "
    "time left out, unlike throughput's); - where no peak is known for the device (a CPU) or the count failed",
    "compile": "seconds of compilation, kept out of the step times (its first steps less as many steady ones)",
    "rounds": "the interleaved rounds of {chunk} timed steps its speed-up rests on; after +, the rounds of its wave dropped "
    "because the start's steps in them moved beyond the drift a round may show (ampkit.tuning._machine.ROUND_DRIFT, or the "
    "start's own noise within a round) and were measured again",
    "peak memory": "the most bytes live during a training step, measured alone (CPU: live tensor bytes of an eager "
    "step, ampkit memory's definition, not measured for a compiled step; CUDA: the allocator's peak)",
    "accuracy": "the configuration's {metric} worse than the fp32 reference's by this much (negative: better), against "
    "the tolerance after <=: the larger of {floor} and twice the gap between two fp32 runs that differ only in batch "
    "order (fp32's own noise: {noise}); {steps} steps from the same weights on the same batches; same arithmetic: only "
    "torch's threads or the DataLoader's settings differ from the start, which change when the work runs, not what it "
    "computes, so no guard is run",
}
"""What each column of the table means; printed as footnotes wherever the table is."""

VERDICTS: dict[str, str] = {
    "winner": "the recommendation: the fastest configuration whose speed-up interval lies wholly above 1.0 (in the "
    "confirmation wave, where there was time for it) and that passed the accuracy guard, or needs none (same arithmetic)",
    "start": "your starting point, the control every speed-up and accuracy gap is measured against; the recommendation "
    "when nothing beat it",
    "faster": "its speed-up interval lies wholly above 1.0 (a gain the step-time noise cannot explain)",
    "no gain": "its speed-up interval holds 1.0: no difference the noise can tell apart",
    "slower": "its speed-up interval lies wholly below 1.0",
    "rejected": "failed the accuracy guard (the reason says by how much)",
    "failed": "the trial raised (the reason says what)",
    "cut": "the budget ended its wave before it had enough timed steps for an interval",
    "disturbed": "the machine disturbed its wave (the start's steps moved between rounds, and the rounds could not be "
    "measured again within the budget): its figures are shown, not judged",
}
"""Every verdict word and its meaning."""

PLOTS: dict[str, str] = {
    "speed_memory.png": "one point per row of the table that has both figures: x its peak memory, y its speed-up over "
    "the start, the error bar its 95% interval, all as the table defines them; the winner a star, rejected ones a "
    "cross; rows without a figure are named under the picture",
    "loss_curves.png": "the training loss per optimizer step of the accuracy guard's runs: the fp32 reference, the same "
    "on reordered batches (how far fp32 moves by chance alone), and each finalist, from the same weights on the same batches",
}
"""What each picture of report.md shows, printed above it (:mod:`ampkit.tuning._plots` draws them)."""


def _trial_rows(result: TuneResult) -> list[Any]:
    from ._trials import Trial

    seen: dict[str, Trial] = {}
    for t in result.trials:
        if (t.role == "baseline" and result.baseline.key not in seen) or (t.role == "candidate" and t.key not in seen):
            seen[t.key] = t  # each configuration once: where its stage tried it (the baseline: its first wave)
        elif t.stage == "final" and t.role == "candidate":
            seen[t.key] = t  # a finalist: as the confirmation wave measured it, beside the other finalists (what ranked it)
    return list(seen.values())


def rows(result: TuneResult) -> list[dict[str, Any]]:
    """The ranked table, one dict per measured configuration (the winner first, then by amortised speed-up; failed
    and cut trials last)."""
    out = []
    for t in _trial_rows(result):
        c = Candidate.from_dict(t.candidate)
        amortised = t.amortised_s(result.run_steps)
        ci = t.interval(result.run_steps) if t.status == "ok" else None
        guard = result.guard_of(c)
        is_base = c.key == result.baseline.key
        if t.status != "ok":
            verdict = t.status
        elif t.disturbed and not is_base:
            verdict = "disturbed"
        elif guard is not None and not guard.passed:
            verdict = "rejected"
        elif is_base:
            verdict = "start"
        elif ci is not None and ci[0] > 1.0:
            verdict = "faster"
        elif ci is not None and ci[1] < 1.0:
            verdict = "slower"
        else:
            verdict = "no gain"
        if dataclasses.replace(c, loader=result.winner.loader) == result.winner and not result.interrupted and not is_base:
            verdict = "winner"
        mfu, mfu_note = row_mfu(t.flops_by_format, t.median_s, result.device)
        out.append({
            "key": c.key, "configuration": c.describe(result.start), "throughput": result.items_per_step / amortised if amortised else None,
            "start_then": result.items_per_step / statistics.median(t.baseline_times_s) if t.baseline_times_s else None,
            "speedup": 1.0 if is_base else t.speedup(result.run_steps), "interval": None if is_base else ci,
            "flops_per_step": sum(t.flops_by_format.values()) or None, "mfu": mfu, "mfu_note": mfu_note, "compile_s": t.compile_s,
            "peak_memory_bytes": t.peak_memory_bytes, "same_arithmetic": c.numerics_key == result.start.numerics_key,
            "gap": guard.gap if guard and not guard.same_arithmetic else None,
            "tolerance": guard.tolerance if guard and not guard.same_arithmetic else None,
            "verdict": verdict, "why": t.error if t.status == "failed" else guard.reason if guard is not None else None, "stage": t.stage,
            "resumed": t.resumed, "rounds": t.rounds, "dropped_rounds": t.dropped_rounds,
        })
    order = {"winner": 0, "start": 2, "disturbed": 3, "failed": 3, "cut": 3}
    out.sort(key=lambda r: (order.get(r["verdict"], 1), -(r["speedup"] or 0.0)))
    return out


def advice(result: TuneResult) -> Advice:
    """The winner as the configuration to recommend (:class:`ampkit._report.dialect.Advice`), with the clipping it
    was measured with."""
    w = result.winner
    return Advice(
        precision=w.policy, keep_fp32=w.keep_fp32, micro_batch=w.micro_batch, accumulate=w.accumulate,
        given_micro_batch=result.start.micro_batch, given_accumulate=result.start.accumulate,
        clip_grad_norm=result.settings.get("clip_grad_norm", AS_GIVEN), compile=w.compile, fused_step=w.fused_step, recompute=w.recompute,
        gradient_checkpointing=result.supports_gradient_checkpointing, threads=w.threads, loader=dict(w.loader), channels_last=w.channels_last,
        device=result.device.get("type"),
    )


def code(result: TuneResult) -> str:
    """The winner as the lines to paste into a training script, in the terms of the framework the model came from
    (:attr:`TuneResult.framework`): ``ampkit.Engine`` for plain PyTorch, ``L.Trainer`` for Lightning,
    ``TrainingArguments`` and a ``Trainer`` for Hugging Face.

    >>> from ampkit.tuning import TuneResult
    >>> start = Candidate(policy="32-true", micro_batch=32, accumulate=1)
    >>> result = TuneResult(workload="toy", description="", device={"type": "cpu"}, unit="samples", items_per_step=32, run_steps=100,
    ...                     budget_s=60, start=start, baseline=start, winner=Candidate(policy="bf16-mixed", micro_batch=16, accumulate=2),
    ...                     settings={"clip_grad_norm": 1.0}, framework="lightning")
    >>> print(code(result))
    import lightning as L
    import torch
    <BLANKLINE>
    trainer = L.Trainer(accelerator="cpu", precision="bf16-mixed", accumulate_grad_batches=2, gradient_clip_val=1.0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16)  # 16 x 2 micro-batches = your batch of 32; in place of what your train_dataloader() returns
    trainer.fit(model, train_dataloaders=loader)
    """
    return paste_code(advice(result), result.framework)


def _fmt_interval(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""


def _cells(result: TuneResult, row: dict[str, Any]) -> list[str]:
    speed = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x{_fmt_interval(row['interval'])}"
    if row["verdict"] == "start":
        accuracy = "the reference"
    else:
        accuracy = ("same arithmetic" if row.get("same_arithmetic") else "not guarded") if row["gap"] is None else f"{row['gap']:+.3g} <= {row['tolerance']:.3g}"
    return [
        row["configuration"] + (" (resumed)" if row["resumed"] else ""),
        "-" if row["throughput"] is None else f"{row['throughput']:,.0f}",
        "-" if row["start_then"] is None else f"{row['start_then']:,.0f}",
        speed, "-" if row["mfu"] is None else f"{row['mfu']:.1%}", "-" if row["compile_s"] is None else f"{row['compile_s']:.1f}",
        (f"{row['rounds']}" + (f" +{row['dropped_rounds']}" if row["dropped_rounds"] else "")) if row["rounds"] else "-",
        fmt_bytes(row["peak_memory_bytes"]), accuracy, row["verdict"], row["why"] or "",
    ]


HEADERS = ["configuration", "throughput", "start then", "speed-up", "MFU", "compile", "rounds", "peak memory", "accuracy", "verdict", "why"]


def machine_line(result: TuneResult) -> str | None:
    """What the tune saw of the machine, in one line; None for a tune without the measurement (an older one).

    >>> from ampkit.tuning import TuneResult
    >>> start = Candidate(policy="32-true", micro_batch=8, accumulate=1)
    >>> r = TuneResult(workload="w", description="", device={}, unit="samples", items_per_step=8, run_steps=1, budget_s=60, start=start,
    ...                baseline=start, winner=start, machine={"cores": 2, "others_cores_at_probe": 1.9, "busy_at_probe": True},
    ...                waves=[{"stage": "precision", "others_cores": 1.8, "dropped_rounds": 2, "disturbed": False}])
    >>> machine_line(r)
    'machine: busy: other processes took 1.9 of the 2 cores as the tune began, up to 1.8 during its waves; 2 rounds dropped for drift and measured again'
    """
    m = result.machine
    if not m:
        return None
    others = [w["others_cores"] for w in result.waves if w.get("others_cores") is not None]
    at_start = m.get("others_cores_at_probe")
    busy = m.get("busy_at_probe") or any(o >= 0.5 for o in others)
    parts = [f"{'busy' if busy else 'quiet'}: other processes took "
             + (f"{at_start:.1f} of the {m.get('cores')} cores as the tune began" if at_start is not None else "an unknown share (the OS does not say)")
             + (f", up to {max(others):.1f} during its waves" if others else "")]
    if m.get("oversubscribed"):
        parts.append(f"torch's threads would have oversubscribed the cores: measured at {m.get('free_threads')} thread(s), against the start there")
    dropped = sum(w.get("dropped_rounds", 0) for w in result.waves)
    if dropped:
        parts.append(f"{dropped} rounds dropped for drift and measured again")
    disturbed = [w["stage"] for w in result.waves if w.get("disturbed")]
    if disturbed:
        parts.append(f"disturbed, not judged: {', '.join(disturbed)}")
    return "machine: " + "; ".join(parts)


def footnotes(result: TuneResult) -> list[str]:
    """The definitions of the columns and of the verdict words the table uses."""
    ref = result.reference
    fill = {
        "unit": result.unit, "run_steps": result.run_steps, "metric": ref.metric if ref else "figure",
        "floor": f"{ref.floor:.3g}" if ref else "the metric's own tolerance", "noise": f"{ref.noise:.3g}" if ref else "not measured",
        "steps": ref.steps if ref else result.settings.get("guard_steps"), "chunk": result.settings.get("chunk", 3),
    }
    notes = [f"{name}: {text.format(**fill)}" for name, text in COLUMNS.items()]
    used = {r["verdict"] for r in rows(result)}
    notes += [f"{word}: {text}" for word, text in VERDICTS.items() if word in used]
    line = machine_line(result)
    return notes + ([line] if line else [])


def render(result: TuneResult, console: Console) -> None:
    """Print the ranked table with its footnotes, the pruned and untried candidates, and the winner's code."""
    from rich.markup import escape
    from rich.syntax import Syntax
    from rich.table import Table

    table = Table(title=f"ampkit tune: {result.workload} on {result.device.get('name', result.device.get('type'))}")
    for h in HEADERS:
        table.add_column(h, justify="right" if h in ("throughput", "start then", "speed-up", "MFU", "compile", "rounds", "peak memory") else "left")
    for row in rows(result):
        table.add_row(*_cells(result, row))
    console.print(table)
    for note in footnotes(result):
        console.print(f"[dim]{escape(note)}[/dim]")
    if result.loader_trials:
        console.print("\nDataLoader settings (the chosen step fed by each loader variant; its time includes waiting for data):")
        for t in result.loader_trials:
            console.print(f"  {t['name']}: {t['step_s'] * 1e3:.1f} ms a step, {t['speedup']:.2f}x the loader as given")
    if result.pruned:
        console.print(f"\npruned before running ({len(result.pruned)}):")
        for p in result.pruned:
            console.print(escape(f"  {p['stage']}: {p['change']}: {p['reason']}"))
    if result.not_tried:
        console.print(f"\nnot tried within --budget {result.budget_s:g} s ({len(result.not_tried)}):")
        for p in result.not_tried:
            console.print(escape(f"  {p['stage']}: {p['change']}: {p['reason']}"))
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    console.print(f"\n[bold]winner[/bold]: {result.winner.describe(result.start)}: {result.winner_reason}")
    console.print(Syntax(code(result), "python", theme="ansi_dark", background_color="default"))
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in result.timings.items() if v >= 0.5)
    console.print(f"[dim]tuned in {result.elapsed_s:.0f} s of a {result.budget_s:g} s budget" + (f" ({parts})" if parts else "")
                  + (f"; {result.resumed} trial(s) read back from an earlier run" if result.resumed else "") + "[/dim]")


def _plot_lines(out: Path, plots: list[Path] | None, plots_note: str | None) -> list[str]:
    """The ``## Plots`` section: each picture's definition and the picture; or why there are none."""
    if plots_note:
        return ["", "## Plots", "", f"No plots: {plots_note}"]
    lines = []
    for path in plots or []:
        for title, link in plot_links(out, [path]):  # none when the file is missing (warned there)
            lines += ["", f"{Path(path).name}: {PLOTS.get(Path(path).name, '')}", "", f"![{title}]({link})"]
    return ["", "## Plots", *lines] if lines else []


def write_report(result: TuneResult, out: Path, plots: list[Path] | None = None, plots_note: str | None = None) -> Path:
    """``report.md``: the same table, footnotes, lists and code as the terminal shows, and ``plots`` (the PNGs of
    :func:`ampkit.tuning._plots.write_plots`, linked relative to ``out``), or ``plots_note``: why there are none."""
    lines = [f"# ampkit tune: {result.workload}", "", f"{result.description}", "",
             f"Device: {result.device.get('name', result.device.get('type'))}; torch {result.torch}; ampkit {result.ampkit}; {result.date}.",
             f"Command: `{result.command}`" if result.command else "", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows(result):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in _cells(result, row)) + " |")
    lines += [""] + [f"- {n}" for n in footnotes(result)]
    lines += _plot_lines(Path(out), plots, plots_note)
    if result.loader_trials:
        lines += ["", "## DataLoader settings", "", "The chosen step fed by each loader variant; its time includes waiting for data.", ""]
        lines += [f"- {t['name']}: {t['step_s'] * 1e3:.1f} ms a step, {t['speedup']:.2f}x the loader as given" for t in result.loader_trials]
    if result.pruned:
        lines += ["", "## Pruned before running", ""] + [f"- {p['stage']}: {p['change']}: {p['reason']}" for p in result.pruned]
    if result.not_tried:
        lines += ["", f"## Not tried within the budget ({result.budget_s:g} s)", ""] + [f"- {p['stage']}: {p['change']}: {p['reason']}" for p in result.not_tried]
    if result.stages:
        lines += ["", "## Stages", ""] + [f"- {s['stage']}: {s['why']}" for s in result.stages]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    lines += ["", "## Winner", "", f"{result.winner.describe(result.start)}: {result.winner_reason}", "", "```python", code(result), "```", ""]
    path = Path(out) / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
