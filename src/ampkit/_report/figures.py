"""Figures for the tools' pictures: a matplotlib figure on its own Agg canvas, its atomic PNG save, the "no data"
placeholder of an empty panel.

Drawn with matplotlib's object API (a :class:`~matplotlib.figure.Figure` on an Agg canvas), never pyplot: no
global figure registry, no GUI backend, nothing left open for the caller's own plots to trip over. matplotlib is
imported when the first figure is made, so a tool that never draws does not pay for it.

    >>> import tempfile
    >>> from pathlib import Path
    >>> fig = new_figure(4, 3, what="the example's plots")
    >>> no_data(fig.add_subplot(), "nothing to draw")
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     save_png(fig, Path(tmp) / "a" / "empty.png").read_bytes()[:4]
    b'\\x89PNG'
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import AmpkitError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["new_figure", "save_png", "no_data", "DPI", "INSTALL_HINT"]

log = logging.getLogger("ampkit")

INSTALL_HINT = 'pip install "ampkit[bench]"'
DPI = 120


def new_figure(width: float, height: float, *, what: str) -> Figure:
    """A ``width`` x ``height`` inch figure on its own Agg canvas; ``what`` names the pictures in the error
    raised when matplotlib is missing (the one place it is imported, so the error is said once).

    >>> new_figure(8, 4.8, what="the bench plots").get_size_inches().tolist()
    [8.0, 4.8]
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise AmpkitError(f"{what} need matplotlib, which is not installed: {INSTALL_HINT}") from exc
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG at ``path`` atomically (parents created): a crash mid-write leaves any previous
    picture whole. Returns the path.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     save_png(new_figure(2, 2, what="plots"), Path(tmp) / "x.png").name
    'x.png'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    log.debug("wrote %s", path)
    return path


def no_data(ax: Axes, message: str) -> None:
    """Say ``message`` in grey in the middle of ``ax`` and hide its ticks: a panel with nothing to draw.

    >>> ax = new_figure(2, 2, what="plots").add_subplot()
    >>> no_data(ax, "no step times")
    >>> [t.get_text() for t in ax.texts], list(ax.get_xticks())
    (['no step times'], [])
    """
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])
