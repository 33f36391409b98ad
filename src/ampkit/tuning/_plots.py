"""The tune's two pictures: speed against memory of every measured configuration, and the accuracy guard's loss curves.

Drawn on the shared figures of :mod:`ampkit._report.figures` (matplotlib's object API, never pyplot), as the
bench's and the profile's are. Each picture is drawn from plain data taken from the result first
(:func:`speed_points`, :func:`loss_curves`), so what it shows is checked as data, not pixels:

- **speed against memory** (:data:`SPEED_MEMORY_PLOT`): one point per row of the ranked table
  (:func:`ampkit.tuning.rows`) that has both figures: x its peak memory, y its speed-up over the start with the
  95% interval as an error bar, both as the table defines them; the winner a star, rejected ones a cross. Rows
  without one of the figures (a failed or cut trial, a compiled step whose memory a CPU does not measure) are
  named under the picture instead of drawn somewhere they were not measured.
- **loss curves** (:data:`LOSS_PLOT`): the training loss per optimizer step of the guard's runs: the fp32
  reference, its twin on reordered batches (how far fp32 moves by chance alone), and each finalist.

    >>> import tempfile
    >>> from ampkit.tuning import Candidate, TuneResult, Trial
    >>> start = Candidate(policy="32-true", micro_batch=8, accumulate=1)
    >>> base = Trial(key=start.key, stage="precision", candidate=start.to_dict(), role="baseline",
    ...              step_times_s=[0.01] * 6, baseline_times_s=[0.01] * 6, peak_memory_bytes=2**20)
    >>> result = TuneResult(workload="toy", description="", device={"type": "cpu"}, unit="samples", items_per_step=8,
    ...                     run_steps=100, budget_s=60, start=start, baseline=start, winner=start, trials=[base])
    >>> [(p.configuration, p.speedup) for p in speed_points(result)[0]]
    [('as given', 1.0)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [p.name for p in write_plots(result, tmp)]
    ['speed_memory.png', 'loss_curves.png']
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._report.figures import new_figure, no_data, save_png
from ._report import rows
from ._space import Candidate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ._result import TuneResult

__all__ = ["LOSS_PLOT", "SPEED_MEMORY_PLOT", "LossCurve", "SpeedPoint", "loss_curves", "loss_figure", "speed_memory_figure", "speed_points", "write_plots"]

SPEED_MEMORY_PLOT = "speed_memory.png"
LOSS_PLOT = "loss_curves.png"
_WHAT = "the tune plots"
"""What the error names when matplotlib is missing."""

# One look per verdict: the winner and the rejected stand out; the rest are the measured field.
_STYLE: dict[str, dict[str, object]] = {
    "winner": {"marker": "*", "markersize": 16, "color": "#2ca02c"},
    "start": {"marker": "s", "markersize": 8, "color": "#444444"},
    "rejected": {"marker": "X", "markersize": 10, "color": "#d62728"},
    "faster": {"marker": "o", "markersize": 7, "color": "#1f77b4"},
    "no gain": {"marker": "o", "markersize": 7, "color": "#7f7f7f"},
    "slower": {"marker": "v", "markersize": 7, "color": "#ff7f0e"},
}
_CURVE_STYLE: dict[str, dict[str, object]] = {
    "reference": {"color": "#222222", "linewidth": 2.0},
    "reordered": {"color": "#222222", "linewidth": 1.2, "linestyle": ":"},
    "winner": {"color": "#2ca02c", "linewidth": 1.8},
    "passed": {"color": "#1f77b4", "linewidth": 1.2},
    "rejected": {"color": "#d62728", "linewidth": 1.2, "linestyle": "--"},
}


@dataclass(frozen=True)
class SpeedPoint:
    """One row of the ranked table as the speed-against-memory picture draws it."""

    configuration: str
    peak_memory_bytes: int
    speedup: float
    interval: tuple[float, float] | None
    """The speed-up's 95% bootstrap interval (None for the start, the control itself)."""
    verdict: str


@dataclass(frozen=True)
class LossCurve:
    """One accuracy-guard run's training loss per optimizer step."""

    label: str
    losses: tuple[float, ...]
    kind: str
    """``reference``, ``reordered`` (the reference's noise), ``winner``, ``passed`` or ``rejected``."""


def speed_points(result: TuneResult) -> tuple[list[SpeedPoint], list[tuple[str, str]]]:
    """The table's rows (:func:`ampkit.tuning.rows`, in its order) that have a peak memory and a speed-up, as
    points, and the others with why they are not drawn."""
    points, left_out = [], []
    for r in rows(result):
        if r["verdict"] in ("failed", "cut"):
            left_out.append((r["configuration"], "its trial failed" if r["verdict"] == "failed" else "too few timed steps"))
        elif r["speedup"] is None:
            left_out.append((r["configuration"], "no speed-up measured"))
        elif r["peak_memory_bytes"] is None:
            left_out.append((r["configuration"], "no peak memory measured (a compiled step on a CPU)"))
        else:
            interval = tuple(r["interval"]) if r["interval"] is not None else None
            points.append(SpeedPoint(r["configuration"], int(r["peak_memory_bytes"]), float(r["speedup"]), interval, r["verdict"]))
    return points, left_out


def _describe(result: TuneResult, numerics_key: str) -> str:
    """A guarded configuration in the table's words (what differs from the start), found by its numerics key."""
    for t in result.trials:
        c = Candidate.from_dict(t.candidate)
        if c.numerics_key == numerics_key:
            return c.describe(result.start)
    return numerics_key


def loss_curves(result: TuneResult) -> list[LossCurve]:
    """The fp32 reference's losses, its reordered twin's, then each finalist's, as the guard trained them."""
    ref = result.reference
    if ref is None:
        return []
    curves = [LossCurve("fp32 reference (the start)", tuple(ref.losses), "reference")]
    if ref.reordered_losses:
        curves.append(LossCurve("fp32, batches reordered (its noise)", tuple(ref.reordered_losses), "reordered"))
    for key, g in result.guard.items():
        if key == result.start.numerics_key:
            continue  # the reference itself
        kind = "rejected" if not g.passed else "winner" if key == result.winner.numerics_key else "passed"
        label = _describe(result, key) + {"rejected": " (rejected)", "winner": " (winner)", "passed": ""}[kind]
        curves.append(LossCurve(label, tuple(g.losses), kind))
    return curves


def _memory_unit(largest: float) -> tuple[str, float]:
    for unit, size in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= size:
            return unit, size
    return "bytes", 1.0


def speed_memory_figure(points: list[SpeedPoint], left_out: list[tuple[str, str]], *, title: str, run_steps: int) -> Figure:
    """Speed-up over the start (with its interval) against peak memory, one point per measured configuration."""
    fig = new_figure(9, 5.4, what=_WHAT)
    ax = fig.add_subplot()
    if not points:
        no_data(ax, "no configuration has both a speed-up and a peak memory")
    else:
        unit, size = _memory_unit(max(p.peak_memory_bytes for p in points))
        ax.axhline(1.0, color="#999999", linewidth=0.8, linestyle="--")
        shown: set[str] = set()
        for p in points:
            x = p.peak_memory_bytes / size
            style = _STYLE.get(p.verdict, _STYLE["no gain"])
            err = None if p.interval is None else [[max(0.0, p.speedup - p.interval[0])], [max(0.0, p.interval[1] - p.speedup)]]
            ax.errorbar([x], [p.speedup], yerr=err, linestyle="none", capsize=4, label=None if p.verdict in shown else p.verdict, **style)  # type: ignore[arg-type]
            shown.add(p.verdict)
            ax.annotate(p.configuration, (x, p.speedup), textcoords="offset points", xytext=(6, 4), fontsize="x-small")
        ax.margins(x=0.12, y=0.1)  # room for the labels of the outermost points
        ax.set_xlabel(f"peak memory ({unit}): the table's 'peak memory'")
        ax.set_ylabel(f"speed-up over the start (compile amortised over {run_steps} steps)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    if left_out:
        text = "not drawn: " + "; ".join(f"{c} ({why})" for c, why in left_out)
        fig.text(0.01, 0.005, text if len(text) <= 160 else text[:159] + "…", fontsize="x-small", color="#666666")
    ax.set_title(f"{title}: speed against memory (error bars: the speed-up's 95% interval)", fontsize="medium")
    return fig


def loss_figure(curves: list[LossCurve], *, title: str) -> Figure:
    """The accuracy guard's training losses against the optimizer step, the fp32 reference's noise beside them."""
    fig = new_figure(8, 4.8, what=_WHAT)
    ax = fig.add_subplot()
    drawn = [c for c in curves if c.losses]
    if not drawn:
        no_data(ax, "no accuracy-guard runs (the guard ran no finalist)")
    else:
        for c in drawn:
            y = [v if v is not None and math.isfinite(v) else math.nan for v in c.losses]
            ax.plot(range(1, len(y) + 1), y, label=c.label, **_CURVE_STYLE.get(c.kind, _CURVE_STYLE["passed"]))  # type: ignore[arg-type]
        ax.set_xlabel("optimizer step (the same weights and batches as the fp32 reference)")
        ax.set_ylabel("training loss")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    ax.set_title(f"{title}: the accuracy guard's training loss", fontsize="medium")
    return fig


def write_plots(result: TuneResult, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write :data:`SPEED_MEMORY_PLOT` and :data:`LOSS_PLOT` into ``out_dir`` (created); return their paths.
    Without matplotlib it raises :class:`ampkit.AmpkitError` naming the install, having written nothing."""
    out = Path(out_dir)
    points, left_out = speed_points(result)
    speed = speed_memory_figure(points, left_out, title=result.workload, run_steps=result.run_steps)
    losses = loss_figure(loss_curves(result), title=result.workload)
    return [save_png(speed, out / SPEED_MEMORY_PLOT), save_png(losses, out / LOSS_PLOT)]
