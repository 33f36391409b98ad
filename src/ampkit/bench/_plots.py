"""The bench's two pictures: the loss curve of every policy, and its step time and memory beside the others.

Drawn on the shared figures of :mod:`ampkit._report.figures` (matplotlib's object API, never pyplot). A run that
produced no figures (failed, unsupported) is left out of a picture rather than breaking it; a diverged run
is drawn up to the step its loss stopped being finite, and marked there.

    >>> import tempfile
    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> run = RunResult(precision="32-true", losses=[2.0, 1.5, 1.2], step_time_median_s=0.01, peak_memory_bytes=2**20)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [p.name for p in write_plots(BenchResult(workload="toy", runs=[run]), tmp)]
    ['loss_curves.png', 'time_memory.png']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._report.figures import DPI, INSTALL_HINT, new_figure, no_data, save_png  # noqa: F401 (DPI, INSTALL_HINT: still importable here)
from ._format import fmt_bytes, fmt_percent, fmt_ratio, is_missing
from ._results import BenchResult, RunResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "LOSS_PLOT",
    "MEMORY_PARTS",
    "TIME_MEMORY_PLOT",
    "loss_figure",
    "plot_losses",
    "plot_time_memory",
    "time_memory_figure",
    "write_plots",
]

LOSS_PLOT = "loss_curves.png"
TIME_MEMORY_PLOT = "time_memory.png"
MEMORY_PARTS = ("parameters", "gradients", "optimizer_state", "master_weights", "activations")
"""The ``memory_breakdown`` keys, stacked bottom to top in this order."""
LOG_Y_RATIO = 30.0
"""A loss range wider than this factor is drawn on a log axis, or the interesting late steps are a flat line."""
_WHAT = "the bench plots"
"""What the error names when matplotlib is missing."""

# tab10: distinct and colour-blind tolerant; a policy keeps its colour in both pictures.
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
_PART_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_state": "#55a868",
    "master_weights": "#c44e52",
    "activations": "#8172b3",
    "other": "#937860",
    "peak memory": "#8c8c8c",
}


def _colors(result: BenchResult) -> dict[str, str]:
    # Indexed over every run, failed ones included, so a policy's colour does not depend on who else failed.
    return {r.label: _COLORS[i % len(_COLORS)] for i, r in enumerate(result.runs)}


def _loss_array(run: RunResult) -> np.ndarray:
    """The losses as floats, with None (NaN in results.json) and inf turned into NaN, which breaks the line."""
    y = np.array([np.nan if v is None else v for v in run.losses], dtype=float)
    y[~np.isfinite(y)] = np.nan
    return y


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over the finite points only; it does not lag the raw curve like an EMA would."""
    finite = np.isfinite(y)
    kernel = np.ones(window)
    sums = np.convolve(np.where(finite, y, 0.0), kernel, mode="same")
    counts = np.convolve(finite.astype(float), kernel, mode="same")
    out = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    out[~finite] = np.nan  # a diverged curve stops where its loss did
    return out


def _window(steps: int) -> int:
    """About 1/20 of the run, odd so the average is centred on its step; 1 (no smoothing) for short runs."""
    return (steps // 20) | 1 if steps >= 40 else 1


def loss_figure(result: BenchResult) -> Figure:
    """Every run's training loss against the step, as a figure (:func:`plot_losses` saves it).

    Each policy gets a faint line of every step and a solid moving average (about 1/20 of the run). Non-finite
    losses are left out; a diverged run is marked with a dotted line at the step its loss broke.
    """
    fig = new_figure(8, 4.8, what=_WHAT)
    ax = fig.add_subplot()
    colors = _colors(result)
    finite_values: list[np.ndarray] = []
    window = 1
    for run in result.runs:
        if not run.ok or not run.losses:
            continue
        y = _loss_array(run)
        steps = np.arange(1, len(y) + 1)
        color, label = colors[run.label], run.label
        broken = np.flatnonzero(np.isnan(y))
        if run.status == "diverged":
            label += f" (diverged at step {broken[0] + 1})" if broken.size else " (diverged)"
        width = _window(len(y))
        if width > 1:
            ax.plot(steps, y, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, _smooth(y, width), color=color, linewidth=1.8, label=label)
            window = max(window, width)
        else:
            ax.plot(steps, y, color=color, linewidth=1.8, label=label)
        if run.status == "diverged" and broken.size:
            ax.axvline(broken[0] + 1, color=color, linestyle=":", linewidth=1.2)
            last = broken[0] - 1  # the last finite loss before the break, if there was one
            if last >= 0 and np.isfinite(y[last]):
                ax.plot([last + 1], [y[last]], marker="x", markersize=9, markeredgewidth=2, color=color)
        finite_values.append(y[np.isfinite(y)])

    values = np.concatenate(finite_values) if finite_values else np.array([])
    if values.size == 0:
        no_data(ax, "no finite training losses to plot")
    else:
        low, high = float(values.min()), float(values.max())
        if low > 0 and high / low > LOG_Y_RATIO:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss" + (" (log scale)" if ax.get_yscale() == "log" else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        if window > 1:
            note = f"solid: {window}-step moving average; faint: every step"
            ax.text(0.01, 0.01, note, transform=ax.transAxes, fontsize="x-small", color="#666666")
    ax.set_title(f"{result.workload}: training loss per policy")
    return fig


def plot_losses(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Save :func:`loss_figure` as a PNG at ``path`` (parent directories are created)."""
    return save_png(loss_figure(result), path)


def _memory_unit(largest: float) -> tuple[str, float]:
    for unit, size in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if largest >= size:
            return unit, size
    return "bytes", 1.0


def _memory_parts(run: RunResult) -> dict[str, float]:
    """The stacked segments of one run's bar: the breakdown (plus what the peak holds beyond it), or the peak."""
    if not run.memory_breakdown:
        return {} if is_missing(run.peak_memory_bytes) else {"peak memory": float(run.peak_memory_bytes or 0)}
    parts = {k: float(v) for k, v in run.memory_breakdown.items() if v}
    counted = sum(parts.values())
    # On CUDA the allocator's peak also holds workspaces and temporaries; show them so the bar is the peak.
    if not is_missing(run.peak_memory_bytes) and (run.peak_memory_bytes or 0) > counted:
        parts["other"] = float(run.peak_memory_bytes or 0) - counted
    return parts


def _tick_labels(runs: list[RunResult]) -> list[str]:
    return [r.label + ("\n(diverged)" if r.status == "diverged" else "") for r in runs]


def _ms(seconds: list[float | None], fallback: np.ndarray | list[float]) -> np.ndarray:
    values = [f if is_missing(s) else s * 1e3 for s, f in zip(seconds, fallback)]  # type: ignore[operator]
    return np.array(values, dtype=float)


def _time_panel(ax: Axes, result: BenchResult, colors: dict[str, str]) -> None:
    runs = [r for r in result.runs if r.ok and not is_missing(r.step_time_median_s)]
    if not runs:
        no_data(ax, "no step times")
        return
    x = np.arange(len(runs))
    median = _ms([r.step_time_median_s for r in runs], [0.0] * len(runs))
    p10 = _ms([r.step_time_p10_s for r in runs], median)  # a missing percentile draws no whisker
    p90 = _ms([r.step_time_p90_s for r in runs], median)
    errors = np.clip(np.vstack([median - p10, p90 - median]), 0, None)
    ax.bar(x, median, color=[colors[r.label] for r in runs], yerr=errors, capsize=4, width=0.6)
    top = np.maximum(median, p90)
    for i, run in enumerate(runs):
        if not is_missing(run.speedup_vs_fp32):
            ax.text(x[i], top[i], fmt_ratio(run.speedup_vs_fp32), ha="center", va="bottom", fontweight="bold")
    ax.set_ylim(0, float(top.max()) * 1.15)  # head-room for the speed-up labels
    ax.set_xticks(x, _tick_labels(runs))
    ax.set_ylabel("median step time (ms)")
    ax.set_title(f"step time (whiskers p10–p90; label: speed-up vs {result.reference})", fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)


def _memory_panel(ax: Axes, result: BenchResult) -> None:
    runs = [r for r in result.runs if r.ok and _memory_parts(r)]
    if not runs:
        no_data(ax, "no memory figures")
        return
    parts = [_memory_parts(r) for r in runs]
    extra = sorted({k for p in parts for k in p} - set(MEMORY_PARTS) - {"other", "peak memory"})
    order = [k for k in (*MEMORY_PARTS, *extra, "other", "peak memory") if any(k in p for p in parts)]
    unit, size = _memory_unit(max(sum(p.values()) for p in parts))
    x = np.arange(len(runs))
    bottom = np.zeros(len(runs))
    for key in order:
        heights = np.array([p.get(key, 0.0) for p in parts]) / size
        ax.bar(x, heights, bottom=bottom, width=0.6, color=_PART_COLORS.get(key), label=key.replace("_", " "))
        bottom += heights
    for i, run in enumerate(runs):
        # The peak, as the table prints it: the parts need not coexist, so their sum may exceed it.
        label = fmt_bytes(sum(parts[i].values()) if is_missing(run.peak_memory_bytes) else run.peak_memory_bytes)
        if not is_missing(run.memory_saved_vs_fp32) and run.label != result.reference:
            label += "\n" + fmt_percent(-(run.memory_saved_vs_fp32 or 0.0), digits=0, signed=True)
        ax.text(x[i], bottom[i], label, ha="center", va="bottom", fontsize="small")
    ax.set_ylim(0, float(bottom.max()) * 1.25)
    ax.set_xticks(x, _tick_labels(runs))
    ax.set_ylabel(f"memory ({unit})")
    what = "allocator peak" if result.device.get("type") == "cuda" else "live-tensor peak"
    ax.set_title(f"memory by part (label: {what}, change vs {result.reference})", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)


def time_memory_figure(result: BenchResult) -> Figure:
    """Two panels: median step time with its p10–p90 spread, and peak memory stacked by part."""
    runs = sum(r.ok for r in result.runs)
    fig = new_figure(max(10.0, 2.2 * runs + 2), 4.8, what=_WHAT)
    time_ax, memory_ax = fig.subplots(1, 2)
    _time_panel(time_ax, result, _colors(result))
    _memory_panel(memory_ax, result)
    fig.suptitle(f"{result.workload}: time and memory per policy")
    return fig


def plot_time_memory(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Save :func:`time_memory_figure` as a PNG at ``path`` (parent directories are created)."""
    return save_png(time_memory_figure(result), path)


def write_plots(result: BenchResult, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``loss_curves.png`` and ``time_memory.png`` into ``out_dir`` (created if needed); return their paths."""
    out = Path(out_dir)
    return [plot_losses(result, out / LOSS_PLOT), plot_time_memory(result, out / TIME_MEMORY_PLOT)]
