"""Tests for the shared figures: the Agg figure, its atomic PNG save, the "no data" panel, missing matplotlib."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ampkit._errors import AmpkitError
from ampkit._report.figures import DPI, INSTALL_HINT, new_figure, no_data, save_png


def test_new_figure_is_sized_on_its_own_canvas() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = new_figure(5, 3, what="plots")
    assert fig.get_size_inches().tolist() == [5.0, 3.0] and fig.dpi == DPI
    assert isinstance(fig.canvas, FigureCanvasAgg)


def test_missing_matplotlib_names_the_pictures_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails as if not installed
    with pytest.raises(AmpkitError, match="the doctor's plots need matplotlib") as err:
        new_figure(5, 3, what="the doctor's plots")
    assert INSTALL_HINT in str(err.value)


def test_save_png_writes_a_png_and_creates_the_folder(tmp_path: Path) -> None:
    path = save_png(new_figure(2, 2, what="plots"), tmp_path / "a" / "b.png")
    assert path == tmp_path / "a" / "b.png" and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert [p.name for p in path.parent.iterdir()] == ["b.png"]


def test_a_failed_save_keeps_the_previous_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plot.png"
    path.write_bytes(b"previous")
    fig = new_figure(2, 2, what="plots")

    def half_written(target: Path, **kwargs: object) -> None:
        Path(target).write_bytes(b"\x89PNG half")
        raise OSError("No space left on device")

    monkeypatch.setattr(fig, "savefig", half_written)
    with pytest.raises(OSError, match="No space left"):
        save_png(fig, path)
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_no_data_says_why_and_hides_the_ticks() -> None:
    ax = new_figure(2, 2, what="plots").add_subplot()
    no_data(ax, "no memory figures")
    assert [t.get_text() for t in ax.texts] == ["no memory figures"]
    assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == []
