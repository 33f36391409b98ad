"""The profile's pictures: where each measured step's time went, and what each input-pipeline trial measured.

Drawn on the shared figures of :mod:`ampkit._report.figures` (matplotlib's object API, never pyplot), from the plain
profile.json dict. Times are in milliseconds, as in the terminal table and the bench's pictures. A profile without
per-step times gets the "no data" placeholder; one without trials gets no trials picture at all.

    >>> import tempfile
    >>> data = {"workload": {"name": "toy"}, "per_step": [{"data": 0.1, "forward": 0.05, "total": 0.15}] * 3}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [p.name for p in write_plots(data, tmp)]
    ['phases.png']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._report.figures import new_figure, no_data, save_png
from .._util.units import fmt_ratio, fmt_seconds, is_missing
from ._table import phase_order

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_plots", "phases_figure", "trials_figure", "PHASES_PLOT", "TRIALS_PLOT", "UNATTRIBUTED"]

PHASES_PLOT = "phases.png"
TRIALS_PLOT = "trials.png"
UNATTRIBUTED = "rest of the step"
"""The segment that makes a bar its step's total when the phases recorded add up to less (a trial timed as a whole)."""
_WHAT = "the profile plots"
"""What the error names when matplotlib is missing."""

# A phase keeps its colour in both pictures; data, the usual culprit, is the loudest.
_PHASE_COLORS = {
    "data": "#d62728",
    "copy": "#ff7f0e",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer": "#9467bd",
    "other": "#8c564b",
    UNATTRIBUTED: "#c7c7c7",
}
_SPARE_COLORS = ("#e377c2", "#bcbd22", "#17becf", "#7f7f7f")
_MS = 1e3


def _colors(names: list[str]) -> dict[str, str]:
    spare = iter(_SPARE_COLORS * len(names))  # a phase this module does not know still gets a colour of its own
    return {n: _PHASE_COLORS.get(n) or next(spare) for n in names}


def _ordered(phases: dict[str, Any], order: list[str]) -> dict[str, float]:
    """``phases`` without the total, in the step's order (phases the order does not know last), None as zero."""
    names = [p for p in order if p in phases] + [p for p in phases if p not in order and p != "total"]
    return {p: float(phases[p] or 0.0) for p in names}


def _stack(ax: Axes, positions: np.ndarray, segments: list[dict[str, float]], totals: list[float | None], *, horizontal: bool) -> np.ndarray:
    """Draw one stacked bar per position, phase by phase (the step's order), topped up to its total; return the ends."""
    names = list(dict.fromkeys(k for s in segments for k in s))
    ends = np.zeros(len(positions))
    heights = {n: np.array([s.get(n, 0.0) * _MS for s in segments]) for n in names}
    # What the phases leave of the total: zero when they add up (a profiled step), the whole bar when none is known.
    rest = np.array([max(0.0, (t or 0.0) * _MS - sum(h[i] for h in heights.values())) for i, t in enumerate(totals)])
    if rest.max(initial=0.0) > 1e-9 * max(1.0, float(rest.sum())):
        heights[UNATTRIBUTED] = rest
    colors = _colors(list(heights))
    bar = ax.barh if horizontal else ax.bar
    for name, size in heights.items():
        if not size.any():
            continue  # no segment of zero height, and no legend entry for a phase no bar has
        kwargs = {"left": ends} if horizontal else {"bottom": ends}
        bar(positions, size, 0.7, color=colors[name], label=name, **kwargs)
        ends = ends + size
    return ends


def phases_figure(data: dict[str, Any]) -> Figure:
    """One stacked bar per measured step, its phases in the order they happen, and a dashed line at the median step.

    >>> fig = phases_figure({"per_step": [{"data": 0.1, "forward": 0.05, "total": 0.15}] * 2})
    >>> [round(float(p.get_height()), 6) for p in fig.axes[0].patches]
    [100.0, 100.0, 50.0, 50.0]
    """
    fig = new_figure(max(6.0, min(14.0, 0.2 * len(data.get("per_step") or []) + 4)), 4.5, what=_WHAT)
    ax = fig.add_subplot()
    steps = [s for s in data.get("per_step") or [] if s]
    name = (data.get("workload") or {}).get("name")
    ax.set_title(f"{name}: where each step's time went" if name else "where each step's time went")
    if not steps:
        no_data(ax, "no per-step times")
        return fig
    order = phase_order(data)
    segments = [_ordered(s, order) for s in steps]
    x = np.arange(1, len(steps) + 1)
    ends = _stack(ax, x, segments, [s.get("total") for s in steps], horizontal=False)
    median = (data.get("step_s") or {}).get("median")
    median_ms = float(np.median(ends)) if is_missing(median) else median * _MS
    ax.axhline(median_ms, color="black", linestyle="--", linewidth=1, label=f"median step ({fmt_seconds(median_ms / _MS)})")
    ax.set_xlabel("measured step")
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps are whole
    ax.set_ylabel("time (ms)")
    ax.set_xlim(0.4, len(steps) + 0.6)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def _trial_total(trial: dict[str, Any]) -> float | None:
    return None if is_missing(trial.get("step_s")) else float(trial["step_s"])


def trials_figure(data: dict[str, Any]) -> Figure:
    """Each input-pipeline trial's step (the mean over its epochs, their starts included) as a horizontal bar (stacked by phase where the trial has them),
    its speed-up over the baseline at the bar's end, the baseline marked by a dotted line.

    >>> fig = trials_figure({"trials": [{"name": "as given", "step_s": 0.2, "speedup": 1.0, "baseline": True},
    ...                                 {"name": "num_workers=2", "step_s": 0.1, "speedup": 2.0}]})
    >>> [t.get_text() for t in fig.axes[0].texts]
    ['1.00x', '2.00x']
    """
    trials = [t for t in data.get("trials") or [] if _trial_total(t) is not None]
    fig = new_figure(8, max(2.5, 0.55 * len(trials) + 1.5), what=_WHAT)
    ax = fig.add_subplot()
    ax.set_title("input-pipeline trials: step as trained, speed-up vs baseline", fontsize="medium")
    if not trials:
        no_data(ax, "no trials")
        return fig
    y = np.arange(len(trials))
    order = phase_order(data)
    segments = [_ordered(t.get("phases") or {}, order) for t in trials]
    ends = _stack(ax, y, segments, [_trial_total(t) for t in trials], horizontal=True)
    for i, trial in enumerate(trials):
        if not is_missing(trial.get("speedup")):
            ax.annotate(fmt_ratio(trial["speedup"]), (ends[i], y[i]), xytext=(3, 0), textcoords="offset points", va="center", fontweight="bold")
    labels = [str(t.get("name") or "?") + ("\n(baseline)" if t.get("baseline") else "") for t in trials]
    ax.set_yticks(y, labels)
    ax.invert_yaxis()  # the order they ran, top to bottom
    baseline = next((t for t in trials if t.get("baseline")), None)
    if baseline is not None:
        ax.axvline(_trial_total(baseline) * _MS, color="black", linestyle=":", linewidth=1)  # type: ignore[operator]
    ax.set_xlim(0, float(ends.max()) * 1.18)  # room for the speed-up labels
    ax.set_xlabel("step time (ms): waiting for data, then the rest of the step")
    if any(t.get("phases") for t in trials):
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def write_plots(data: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``phases.png`` and, when the profile has trials, ``trials.png`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    paths = [save_png(phases_figure(data), out / PHASES_PLOT)]
    if any(_trial_total(t) is not None for t in data.get("trials") or []):
        paths.append(save_png(trials_figure(data), out / TRIALS_PLOT))
    return paths
