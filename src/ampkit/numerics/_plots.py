"""The doctor's two pictures: where the gradients' binary exponents sit against fp16's range, overall and per module.

Both are histograms of ``floor(log2|g|)`` (one bar per binade, counts on a log axis) with fp16's limits shaded:
values below 2^-24 flush to zero, 2^-24..2^-14 are subnormal (fewer significant bits), 2^16 and up overflow
(fp16's largest value is 65504). The outline is the same histogram multiplied by the recommended loss scale 2^k,
which moves every bar exactly k binades right. bf16 shares fp32's exponent range; its limits (2^-133, 2^127) are
drawn where the axis reaches them, else named at the axis edge rather than stretching the axis over 260 binades.

Drawn on the shared figures of :mod:`ampkit._report.figures`, like the bench's. Without matplotlib,
:func:`write_plots` warns and writes nothing: the doctor's findings stand on their own.

    >>> import tempfile
    >>> hist = {"exponent_lo": -30, "counts": [3, 0, 5, 8, 13, 8, 5]}
    >>> data = {"loss_scale_log2": 10, "gradient_histograms": {"weights": hist, "activations": hist},
    ...         "modules": [{"name": "fc", "severity": 1.0, "grads": {"count": 42, "histogram": hist}}]}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     [p.name for p in write_plots(data, tmp)]
    ['gradient_exponents.png', 'module_gradients.png']
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import AmpkitError
from .._report.figures import DPI, INSTALL_HINT, new_figure, no_data, save_png  # noqa: F401 (DPI, INSTALL_HINT: still importable here)
from ._cells import module_label
from ._formats import BF16, FP16
from ._module_table import ranked_modules

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_plots", "gradient_figure", "module_figure", "GRADIENT_PLOT", "MODULE_PLOT", "MAX_MODULES"]

log = logging.getLogger("ampkit")

GRADIENT_PLOT = "gradient_exponents.png"
MODULE_PLOT = "module_gradients.png"
MAX_MODULES = 12
"""Small multiples drawn: the worst modules by severity; more would be too small to read."""
_COLS = 4
_WHAT = "the doctor's plots"
"""What the error names when matplotlib is missing."""

_FLUSH, _NORMAL = FP16.exponent_range[0], FP16.normal_exponent  # -24, -14
_OVERFLOW = FP16.exponent_range[1] + 1  # 16: every value of exponent 16 or more is above 65504
_BF16_LO, _BF16_HI = BF16.exponent_range[0], BF16.exponent_range[1] + 1  # -133, 128
_REGIONS = (  # (from, to, colour, legend): None is the axis edge
    (None, _FLUSH, "#d62728", f"fp16 flushes to zero (below $2^{{{_FLUSH}}}$)"),
    (_FLUSH, _NORMAL, "#ff7f0e", f"fp16 subnormal ($2^{{{_FLUSH}}}$ to $2^{{{_NORMAL}}}$)"),
    (_OVERFLOW, None, "#b2182b", f"fp16 overflows ($2^{{{_OVERFLOW}}}$ and up: above {FP16.max:g})"),
)
_UNSCALED, _SCALED = "#1f77b4", "#2ca02c"


def _histogram(hist: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(bin edges, counts) of a ``{"exponent_lo", "counts"}`` histogram; None when it holds no values."""
    counts = np.asarray((hist or {}).get("counts") or [], dtype=float)
    if counts.size == 0 or counts.sum() <= 0:
        return None
    lo = int((hist or {}).get("exponent_lo", 0))
    return np.arange(lo, lo + counts.size + 1), counts


def _x_range(histograms: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[float, float]:
    """Every bar, shifted or not, and all of fp16's range with a binade or two either side."""
    lo = min(float(edges[0]) for edges, _ in histograms)
    hi = max(float(edges[-1]) for edges, _ in histograms)
    return min(lo, lo + k, _FLUSH) - 2, max(hi, hi + k, _OVERFLOW) + 2


def _shade_fp16(ax: Axes, xlim: tuple[float, float], *, labels: bool) -> None:
    for start, stop, color, label in _REGIONS:
        ax.axvspan(xlim[0] if start is None else start, xlim[1] if stop is None else stop, color=color,
                   alpha=0.12, linewidth=0, label=label if labels else None)  # fmt: skip
    ax.set_xlim(*xlim)


def _mark_bf16(ax: Axes, xlim: tuple[float, float]) -> None:
    """bf16's limits as lines where the axis reaches them, else as a note at that edge of the axis."""
    notes = ((_BF16_LO, 0, f"← bf16 reaches $2^{{{_BF16_LO}}}$"), (_BF16_HI, 1, "bf16 reaches $2^{127}$ →"))
    for limit, edge, text in notes:
        if xlim[0] <= limit <= xlim[1]:
            ax.axvline(limit, color="#9467bd", linestyle="--", linewidth=1)
        else:
            x = 0.01 if edge == 0 else 0.99
            ax.text(x, 0.97, text, transform=ax.transAxes, ha="left" if edge == 0 else "right", va="top",
                    fontsize="x-small", color="#9467bd")  # fmt: skip


def _format_axes(ax: Axes, top: float) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_yscale("log")
    ax.set_ylim(0.5, top * 4)  # a bin of one value still shows as a bar; head-room for the edge notes
    ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"$2^{{{int(v)}}}$"))
    ax.grid(True, axis="y", alpha=0.3)


def _draw(ax: Axes, hist: tuple[np.ndarray, np.ndarray], k: int | None, *, labels: bool) -> None:
    edges, counts = hist
    # Bars start at each binade's left edge: a value of exponent e lies in [2^e, 2^(e+1)).
    ax.bar(edges[:-1], counts, width=1.0, align="edge", color=_UNSCALED, alpha=0.7, label="unscaled" if labels else None)
    if k:
        ax.stairs(counts, edges + k, color=_SCALED, linewidth=1.5, label=f"× $2^{{{k}}}$ (loss scale)" if labels else None)
    _format_axes(ax, float(counts.max()))


def gradient_figure(data: dict[str, Any]) -> Figure | None:
    """Weight and activation gradients' exponent histograms, unscaled and at the loss scale; None if both are empty."""
    sources = data.get("gradient_histograms") or {}
    kinds = {kind: _histogram(sources.get(kind)) for kind in ("weights", "activations")}
    drawn = [h for h in kinds.values() if h is not None]
    if not drawn:
        log.info("doctor: no gradient values were recorded; not drawing %s", GRADIENT_PLOT)
        return None
    first = next(i for i, h in enumerate(kinds.values()) if h is not None)  # its bars label the legend
    k = data.get("loss_scale_log2")
    xlim = _x_range(drawn, k or 0)
    fig = new_figure(10, 6.5, what=_WHAT)
    axes = fig.subplots(2, 1, sharex=True)
    for i, (ax, (kind, hist)) in enumerate(zip(axes, kinds.items())):
        _shade_fp16(ax, xlim, labels=i == 0)
        if hist is None:
            no_data(ax, f"no {kind.removesuffix('s')} gradients recorded")
            ax.set_xlim(*xlim)
        else:
            _draw(ax, hist, k, labels=i == first)
            _mark_bf16(ax, xlim)
        ax.set_ylabel(f"{kind.removesuffix('s')} gradients\n(values, log scale)")
    axes[-1].set_xlabel("binary exponent floor(log2|g|)")
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    name = (data.get("workload") or {}).get("name") or "doctor"
    fig.suptitle(f"{name}: gradient exponents against fp16's range", parse_math=False)  # a '$' in a name is text
    return fig


def module_figure(data: dict[str, Any], limit: int = MAX_MODULES) -> Figure | None:
    """Each of the ``limit`` worst modules' gradient histogram, on one shared axis; None if none has gradients."""
    chosen = [(m, h) for m in ranked_modules(data) if (h := _histogram((m.get("grads") or {}).get("histogram")))]
    chosen = chosen[:limit]
    if not chosen:
        log.info("doctor: no module has gradient statistics; not drawing %s", MODULE_PLOT)
        return None
    k = data.get("loss_scale_log2")
    xlim = _x_range([h for _, h in chosen], k or 0)
    cols = min(_COLS, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    fig = new_figure(3.2 * cols + 0.5, 2.4 * rows + 1.0, what=_WHAT)
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    for i, (module, hist) in enumerate(chosen):
        ax = axes[i]
        _shade_fp16(ax, xlim, labels=i == 0)
        _draw(ax, hist, k, labels=i == 0)
        title = f"{module_label(module.get('name'))} ({module.get('type') or '?'})"
        ax.set_title(title if len(title) <= 40 else title[:39] + "…", fontsize="small", parse_math=False)
        ax.tick_params(labelsize="x-small")
    for ax in axes[len(chosen):]:
        ax.set_visible(False)
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    fig.suptitle(f"weight gradients of the {len(chosen)} worst modules (by severity)", fontsize="medium")
    return fig


def write_plots(data: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write :data:`GRADIENT_PLOT` and :data:`MODULE_PLOT` into ``out_dir`` (created); return the paths written.

    A picture with nothing to draw is skipped (logged); without matplotlib nothing is written and a warning says
    how to install it.
    """
    out = Path(out_dir)
    written = []
    try:
        for name, build in ((GRADIENT_PLOT, gradient_figure), (MODULE_PLOT, module_figure)):
            fig = build(data)
            if fig is not None:
                written.append(save_png(fig, out / name))
    except AmpkitError as exc:
        log.warning("doctor: %s; writing no plots", exc)
    return written
