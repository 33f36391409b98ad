"""The terminal view of a profile: what ran, where the step's time goes, the syncs, the op shares, the trials and the
advice, each figure as the profile measured it.

Everything here reads the plain dict written as profile.json, so a saved profile renders exactly like a fresh one,
and every section is optional: a CPU run has no device idle, a user's loop may have no trials. The rows and lines
are defined once (:func:`phase_rows`, :func:`sync_rows`, :func:`trial_rows`, :func:`advice_parts`, ...) and reused
by report.md, so the terminal and the report never disagree.

    >>> import io
    >>> from rich.console import Console
    >>> data = {"workload": {"name": "toy"}, "steps": 10, "step_s": {"median": 0.2},
    ...         "phases": {"data": {"median_s": 0.15, "share": 0.75}, "forward": {"median_s": 0.05, "share": 0.25}}}
    >>> console = Console(file=io.StringIO(), width=120)
    >>> render(data, console)
    >>> text = console.file.getvalue()
    >>> "ampkit profile: toy" in text, "75.0%" in text, "waiting for the next batch" in text
    (True, True, True)
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from .._report.tables import TableRows
from .._util.units import (
    MISSING,
    fmt_float,
    fmt_ratio,
    fmt_seconds,
    fmt_share,
    is_missing,
)
from ._disturbed import disturbed, disturbed_line

__all__ = [
    "PHASE_MEANINGS",
    "TOP_SYNCS",
    "advice_parts",
    "header_lines",
    "idle_line",
    "ops_lines",
    "overhead_line",
    "phase_order",
    "phase_rows",
    "render",
    "sync_line",
    "sync_rows",
    "sentence",
    "trial_rows",
]  # fmt: skip

PHASE_MEANINGS = {
    "data": "waiting for the next batch (the DataLoader)",
    "copy": "host-to-device copy of the batch",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "the optimizer step (unscale, clip, update)",
    "other": "the loop's own code (logging, read-backs, loss outside autocast) and the rest",
}
"""The "what it is" of each phase; a phase not named here is shown without one."""
TOP_SYNCS = 5
"""Sync sites the terminal shows; the rest are in profile.json (and report.md shows them all)."""


def _phase_name(name: str) -> str:
    return name.replace("_", " ")


def header_lines(data: dict[str, Any]) -> list[str]:
    """What ran: the workload (and size), its description, then device, precision, steps and the median step.

    >>> header_lines({"workload": {"name": "digits-aug", "size": "small"}, "device": "cpu", "precision": "bf16-mixed",
    ...               "steps": 30, "step_s": {"median": 0.182, "p10": 0.175, "p90": 0.201}})
    ['ampkit profile: digits-aug (size small)', 'device cpu · bf16-mixed · 30 steps measured · median step 182 ms (p10–p90 175–201)']
    """
    workload = data.get("workload") or {}
    title = f"ampkit profile: {workload['name']}" if workload.get("name") else "ampkit profile"  # a user's loop may have none
    if workload.get("size"):
        title += f" (size {workload['size']})"
    lines = [title] + ([str(workload["description"])] if workload.get("description") else [])
    device = str(data.get("device") or "unknown")
    if data.get("device_name") and data["device_name"] != device:
        device += f" ({data['device_name']})"
    facts = [f"device {device}"]
    facts += [str(data["precision"])] if data.get("precision") else []
    facts += [f"compiled ({data['compile']})" if isinstance(data["compile"], str) else "compiled"] if data.get("compile") else []
    steps = data.get("steps")
    # A step is an optimizer step: with gradient accumulation, that many batches (each figure is per such step).
    batches = f" of {data['accumulate']} batches" if (data.get("accumulate") or 1) > 1 else ""
    kind = "optimizer step" if batches else "step"
    facts += [f"{steps} {kind}{'s' if steps != 1 else ''}{batches} measured"] if steps is not None else []
    step = data.get("step_s") or {}
    if not is_missing(step.get("median")):
        spread = ""
        if not is_missing(step.get("p10")) and not is_missing(step.get("p90")):
            spread = f" (p10–p90 {fmt_seconds(step['p10'], unit=False)}–{fmt_seconds(step['p90'], unit=False)})"
        facts.append(f"median step {fmt_seconds(step['median'])}{spread}")
    return lines + [" · ".join(facts)]


def phase_order(data: dict[str, Any]) -> list[str]:
    """The phases in the order they happen: as profile.json lists them (``phases``, else the per-step keys).

    >>> phase_order({"per_step": [{"data": 0.1, "forward": 0.02, "total": 0.12}]})
    ['data', 'forward']
    """
    if data.get("phases"):
        return list(data["phases"])
    return [k for k in ((data.get("per_step") or [{}])[0] or {}) if k != "total"]


def phase_rows(data: dict[str, Any]) -> TableRows:
    """The phase table as plain strings, the largest share first (ties keep the step's order).

    >>> rows = phase_rows({"phases": {"data": {"median_s": 0.02, "share": 0.1}, "forward": {"median_s": 0.18, "share": 0.9}}})
    >>> [r[:3] for r in rows.rows]
    [['forward', '180 ms', '90.0%'], ['data', '20.0 ms', '10.0%']]
    """
    phases = data.get("phases") or {}

    def share(name: str) -> float:
        value = (phases[name] or {}).get("share")
        return -1.0 if is_missing(value) else float(value)

    rows = []
    for name in sorted(phases, key=lambda n: -share(n)):  # sorted() is stable: ties keep the step's order
        phase = phases[name] or {}
        rows.append([_phase_name(name), fmt_seconds(phase.get("median_s")), fmt_share(phase.get("share")), PHASE_MEANINGS.get(name, "")])
    return TableRows(headers=["Phase", "Median\nper step", "Share\nof step", "What it is"], rows=rows, justify=["left", "right", "right", "left"])


def idle_line(data: dict[str, Any]) -> str | None:
    """The device's idle time in words; None where it was not measured (on the CPU).

    >>> idle_line({"device_idle": {"share": 0.41, "seconds_per_step": 0.07}})
    'Device idle: 41.0% of the step (70.0 ms per step) with no kernel running.'
    >>> idle_line({"device_idle": None}) is None
    True
    """
    idle = data.get("device_idle")
    if not idle or is_missing(idle.get("share")):
        return None
    per_step = f" ({fmt_seconds(idle['seconds_per_step'])} per step)" if not is_missing(idle.get("seconds_per_step")) else ""
    return f"Device idle: {fmt_share(idle['share'])} of the step{per_step} with no kernel running."


def sync_line(data: dict[str, Any]) -> str | None:
    """The host syncs per step and at how many places; None where syncs were not looked for.

    >>> sync_line({"syncs": {"per_step": 1.0, "sites": [{"where": "train.py:42 in train"}]}})
    'Host syncs: 1 per step, at 1 place in the code.'
    """
    syncs = data.get("syncs")
    if not syncs:
        return None
    sites = syncs.get("sites") or []
    where = f", at {len(sites)} place{'s' if len(sites) != 1 else ''} in the code" if sites else ""
    return f"Host syncs: {fmt_float(syncs.get('per_step'), 3)} per step{where}."


def sync_rows(data: dict[str, Any], top: int | None = TOP_SYNCS) -> TableRows:
    """The sync sites as plain strings, most syncs first, at most ``top`` of them (all when None). A read made
    inside a library the user's line called is at the user's line, "via" the library's.

    >>> sync_rows({"syncs": {"sites": [{"where": "train.py:42 in train", "op": "item", "count": 30,
    ...                                 "per_step": 1.0, "code": "print(loss.item())"}]}}).rows
    [['train.py:42 in train', 'item', '30', '1', 'print(loss.item())']]
    """
    sites = sorted((data.get("syncs") or {}).get("sites") or [], key=lambda s: -(s.get("count") or 0))
    rows = [
        [str(s.get("where") or MISSING) + (f", via {s['via']}" if s.get("via") else ""), str(s.get("op") or MISSING), str(s.get("count", MISSING)),
         fmt_float(s.get("per_step"), 3), str(s.get("code") or "")]
        for s in (sites if top is None else sites[:top])
    ]  # fmt: skip
    return TableRows(headers=["Where", "Op", "Count", "Per step", "Code"], rows=rows, justify=["left", "left", "right", "right", "left"])


def ops_lines(data: dict[str, Any]) -> list[str]:
    """The casts' and the optimizer's share of the ops and the host's own overhead, read from torch.profiler; none
    where they were not read.

    >>> ops_lines({"ops": {"cast_share": 0.08, "casts_per_step": 124, "optimizer_ops_per_step": 15, "optimizer_share": 0.05}})
    ['Casts: 8.0% of forward + backward (124 cast ops per step).', 'Optimizer: 15 ops per step (5.0% of the step).']
    """
    ops = data.get("ops")
    if not ops:
        return []
    lines = []
    if not is_missing(ops.get("cast_share")):
        count = f" ({fmt_float(ops['casts_per_step'])} cast ops per step)" if not is_missing(ops.get("casts_per_step")) else ""
        lines.append(f"Casts: {fmt_share(ops['cast_share'])} of forward + backward{count}.")
    if not is_missing(ops.get("optimizer_ops_per_step")):
        share = f" ({fmt_share(ops['optimizer_share'])} of the step)" if not is_missing(ops.get("optimizer_share")) else ""
        lines.append(f"Optimizer: {fmt_float(ops['optimizer_ops_per_step'])} ops per step{share}.")
    if not is_missing(ops.get("host_share")):
        lines.append(f"Host overhead: {fmt_share(ops['host_share'])} of forward, backward and optimizer ran outside any op (Python, module calls, autograd).")
    return lines


def trial_rows(data: dict[str, Any]) -> TableRows:
    """The input-pipeline trials as plain strings, in the order they ran; the baseline is marked. ``step`` is the
    mean step over the trial's epochs, their starts included (what a worker pool's start costs), ``steady`` the
    median step, ``epoch start`` the wait for an epoch's first batch.

    >>> trial_rows({"trials": [{"name": "as given", "step_s": 0.18, "median_step_s": 0.17, "epoch_start_s": 0.05, "speedup": 1.0, "baseline": True},
    ...                        {"name": "num_workers=2", "step_s": 0.081, "speedup": 2.22}]}).rows
    [['as given (baseline)', '180 ms', '170 ms', '50.0 ms', '1.00x'], ['num_workers=2', '81.0 ms', '—', '—', '2.22x']]
    """
    rows = []
    for trial in data.get("trials") or []:
        name = str(trial.get("name") or MISSING) + (" (baseline)" if trial.get("baseline") else "")
        rows.append([
            name, fmt_seconds(trial.get("step_s")), fmt_seconds(trial.get("median_step_s")), fmt_seconds(trial.get("epoch_start_s")),
            fmt_ratio(trial.get("speedup")),
        ])
    return TableRows(
        headers=["Setting", "Step\n(mean)", "Steady\nstep", "Epoch\nstart", "Speed-up\nvs baseline"], rows=rows,
        justify=["left", "right", "right", "right", "right"],
    )


def advice_parts(item: dict[str, Any]) -> list[tuple[str, str]]:
    """One piece of advice as (label, text) pairs, the finding first; the labels of missing parts are left out.

    >>> advice_parts({"topic": "casts", "finding": "8% of the step casts", "change": "compile", "measured": None,
    ...               "confirm": "ampkit bench --compile"})
    [('casts', '8% of the step casts'), ('change', 'compile'), ('confirm with', 'ampkit bench --compile')]
    """
    parts = [(str(item.get("topic") or "finding"), str(item.get("finding") or MISSING))]
    labels = (("change", "change"), ("measured", "measured"), ("untested", "untested"), ("confirm", "confirm with"))
    return parts + [(label, str(item[key])) for key, label in labels if item.get(key)]


def sentence(text: str) -> str:
    """A note stored lower-case and unstopped in profile.json, as a sentence.

    >>> sentence("no settings were tried: the data is read once")
    'No settings were tried: the data is read once.'
    """
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def overhead_line(data: dict[str, Any]) -> str | None:
    """The profiler's own cost: each measuring window's median step over the plain window's (1.00x: measuring cost
    nothing); None when the plain step was not measured.

    A window only adds to a step, so one faster than the plain step by more than the timed steps' own noise (their
    p10-p90 spread, as a share of their median) measured no overhead: the plain steps were slowed by something
    else. The line then says so instead of printing a ratio below 1 as the profiler's cost; so it does when the
    machine was busy while the steps ran (:mod:`ampkit.profile._disturbed`).

    >>> print(overhead_line({"overhead": {"plain_step_s": 0.170, "profiled_step_s": 0.172, "sync_step_s": 0.2, "trace_step_s": None}}))
    Profiler overhead (a window's median step over the plain window's; 1.00x: no cost), against the plain 170 ms: phases timed 1.01x, syncs counted 1.18x.
    """
    overhead = data.get("overhead") or {}
    plain = overhead.get("plain_step_s")
    if is_missing(plain) or not plain:
        return None
    windows = (("profiled_step_s", "phases timed"), ("sync_step_s", "syncs counted"), ("trace_step_s", "torch.profiler"))
    measured = [(name, overhead[key]) for key, name in windows if not is_missing(overhead.get(key))]
    if not measured:
        return None
    if disturbed(data):
        return "Profiler overhead not read: the run was disturbed (other processes held the cores while the steps ran)."
    noise = _step_noise(data)
    # Below the plain step by more than the noise: t < plain / (1 + noise), which a noise above 1 cannot make vacuous.
    fast = [(name, t) for name, t in measured if noise is not None and t * (1 + noise) < plain]
    if fast:
        name, t = min(fast, key=lambda f: f[1])
        return (
            f"Profiler overhead not read: the plain steps were disturbed. Their median ({fmt_seconds(plain)}) is above "
            f"that of the steps with {name} ({fmt_seconds(t)}) by more than the timed steps' own spread "
            f"({fmt_share(noise)} of their median), and measuring only adds to a step: something else slowed the plain "
            "steps (another process on the cores, a compile or warm-up still running). Rerun on a quiet machine, or "
            "with more warm-up steps."
        )
    parts = [f"{name} {fmt_ratio(t / plain)}" for name, t in measured]
    return f"Profiler overhead ({OVERHEAD_DEFINITION}), against the plain {fmt_seconds(plain)}: {', '.join(parts)}."


OVERHEAD_DEFINITION = "a window's median step over the plain window's; 1.00x: no cost"
"""What an overhead ratio is, printed with the ratios."""


def _step_noise(data: dict[str, Any]) -> float | None:
    """The timed steps' p10-p90 spread as a share of their median: the step's noise in this run; None if unknown."""
    step = data.get("step_s") or {}
    median, p10, p90 = step.get("median"), step.get("p10"), step.get("p90")
    if any(is_missing(v) for v in (median, p10, p90)) or not median:
        return None
    return float((p90 - p10) / median)


def _table(rows: TableRows, title: str, wraps: tuple[str, ...] = ()) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", header_style="bold")
    for header, justify in zip(rows.headers, rows.justify):
        # Figures keep to one line; names, code and prose may wrap on a narrow terminal, code folded mid-word
        # rather than cut short with an ellipsis.
        wrap = header in wraps
        table.add_column(header, justify=justify, no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")  # type: ignore[arg-type]
    for row in rows.rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: a "[" in code is not rich markup
    return table


def _indented(console: Console, text: str, style: str = "") -> None:
    # Indented as a block, so a wrapped line still reads as part of its item.
    console.print(Padding(Text(text, style=style), (0, 0, 0, 2), expand=False))


def _render_advice(data: dict[str, Any], console: Console) -> None:
    advice = data.get("advice") or []
    if not advice:
        return
    console.print()
    console.print(Text("Advice:", style="bold"))
    for number, item in enumerate(advice, start=1):
        (topic, finding), *rest = advice_parts(item)
        console.print(Text(f"{number}. {topic}: {finding}"))
        for label, text in rest:
            if label in ("measured", "untested"):
                _indented(console, f"{label}: {text}", "green" if label == "measured" else "yellow")
            else:  # code to paste or a command to run: soft-wrapped, so rich puts no newline inside it
                console.print(Text(f"  {label}: {text}"), soft_wrap=True)


def render(data: dict[str, Any], console: Console, top: int = TOP_SYNCS) -> None:
    """Print the profile ``data`` (the profile.json dict) to ``console``: at most ``top`` sync sites."""
    title, *rest = header_lines(data)
    console.print(Text(title, style="bold"))
    for line in rest:
        console.print(Text(line))
    warning = disturbed_line(data)
    if warning:
        console.print(Text(warning, style="bold yellow"))
    phases = phase_rows(data)
    if phases.rows:
        console.print(_table(phases, "Where the step's time goes", wraps=("What it is",)))
    else:
        console.print(Text("No phase times were recorded.", style="dim"))
    idle = idle_line(data)
    if idle:
        console.print(Text(idle))
    syncs = sync_line(data)
    if syncs:
        console.print()
        console.print(Text(syncs))
        sites = sync_rows(data, top)
        if sites.rows:
            console.print(_table(sites, "", wraps=("Where", "Code")))
        hidden = len((data.get("syncs") or {}).get("sites") or []) - len(sites.rows)
        if hidden > 0:
            console.print(Text(f"... {hidden} more in profile.json", style="dim"))
    ops = ops_lines(data)
    if ops:
        console.print()
        for line in ops:
            console.print(Text(line))
    trials = trial_rows(data)
    if trials.rows:
        console.print()
        console.print(_table(trials, "Input-pipeline trials (measured)", wraps=("Setting",)))
    if data.get("trials_note"):
        console.print()
        console.print(Text(sentence(data["trials_note"])))
    _render_advice(data, console)
    overhead = overhead_line(data)
    if overhead:
        console.print()
        console.print(Text(overhead, style="dim"))
