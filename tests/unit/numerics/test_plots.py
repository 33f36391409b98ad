"""Tests for the doctor's plots: real PNGs, what each picture marks, empty data, missing matplotlib."""

from __future__ import annotations

import copy
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ampkit._errors import AmpkitError
from ampkit.numerics._plots import GRADIENT_PLOT, MAX_MODULES, MODULE_PLOT, gradient_figure, module_figure, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82"), f"{path} is truncated"
    return struct.unpack(">II", data[16:24])


def _texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _legend(fig: Any) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_write_plots_writes_two_valid_pngs(doctor_data: dict[str, Any], tmp_path: Path) -> None:
    paths = write_plots(doctor_data, tmp_path / "out")
    assert [p.name for p in paths] == [GRADIENT_PLOT, MODULE_PLOT]
    for path in paths:
        width, height = _png_size(path)
        assert 600 <= width <= 3000 and 300 <= height <= 2000
        assert path.stat().st_size > 10_000  # a blank canvas compresses to a few KiB
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([GRADIENT_PLOT, MODULE_PLOT])


def test_gradient_figure_marks_fp16_and_the_loss_scale(doctor_data: dict[str, Any]) -> None:
    fig = gradient_figure(doctor_data)
    assert fig is not None
    weights, activations = fig.axes[:2]
    legend = _legend(fig)
    assert any("flushes to zero" in t for t in legend) and any("subnormal" in t for t in legend)
    assert any("overflows" in t and "65504" in t for t in legend)
    assert "× $2^{13}$ (loss scale)" in legend
    low, high = weights.get_xlim()
    assert low < -24 and high > 16  # all of fp16's range is on the axis
    assert low <= -40 and high >= -16 + 13  # and every bar, shifted or not
    # The unscaled bars: one per binade, from the lowest weight-gradient exponent up, each as tall as its count.
    hist = doctor_data["gradient_histograms"]["weights"]
    bars = list(weights.containers[0])
    assert [p.get_x() for p in bars] == [hist["exponent_lo"] + i for i in range(len(hist["counts"]))]
    assert [p.get_height() for p in bars] == hist["counts"] and {p.get_width() for p in bars} == {1.0}
    assert weights.get_yscale() == "log" and activations.get_yscale() == "log"


def test_bf16_limits_are_edge_notes_unless_the_axis_reaches_them(doctor_data: dict[str, Any]) -> None:
    fig = gradient_figure(doctor_data)
    assert "← bf16 reaches $2^{-133}$" in _texts(fig) and "bf16 reaches $2^{127}$ →" in _texts(fig)
    hist = doctor_data["gradient_histograms"]["weights"]
    hist["exponent_lo"], hist["counts"] = -140, [1] + hist["counts"]  # a gradient down at 2^-140
    fig = gradient_figure(doctor_data)
    weights = fig.axes[0]
    assert weights.get_xlim()[0] <= -142
    assert not any(t.startswith("← bf16") for t in _texts(fig))
    assert any(list(line.get_xdata()) == [-133, -133] for line in weights.get_lines())  # drawn at its place


def test_module_figure_is_worst_first(doctor_data: dict[str, Any]) -> None:
    fig = module_figure(doctor_data)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    # act and drop have no gradients: no panel for them.
    assert [ax.get_title() for ax in visible] == ["fc1 (Linear)", "(model) (TinyNet)", "head|out_proj (Linear)"]


def test_module_figure_keeps_to_the_limit(doctor_data: dict[str, Any]) -> None:
    fc1 = doctor_data["modules"][1]
    doctor_data["modules"] = [dict(copy.deepcopy(fc1), name=f"fc{i}", severity=float(i)) for i in range(20)]
    fig = module_figure(doctor_data)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert len(titles) == MAX_MODULES and titles[0] == "fc19 (Linear)" and titles[-1] == "fc8 (Linear)"


def test_dollar_in_a_module_name_is_text_not_math(doctor_data: dict[str, Any], tmp_path: Path) -> None:
    doctor_data["modules"][1]["name"] = "cost$1"  # an unbalanced $ would break mathtext at draw time
    paths = write_plots(doctor_data, tmp_path)
    assert len(paths) == 2 and "cost$1 (Linear)" in [ax.get_title() for ax in module_figure(doctor_data).axes]


def test_nothing_to_draw_is_skipped(doctor_data: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    empty = {"exponent_lo": 0, "counts": []}
    doctor_data["gradient_histograms"] = {"weights": empty, "activations": {"exponent_lo": -3, "counts": [0, 0]}}
    for module in doctor_data["modules"]:
        module["grads"] = None
    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert write_plots(doctor_data, tmp_path) == []
    assert GRADIENT_PLOT in caplog.text and MODULE_PLOT in caplog.text
    assert list(tmp_path.iterdir()) == []
    assert write_plots({}, tmp_path) == []


def test_one_empty_kind_still_draws_the_other(doctor_data: dict[str, Any], tmp_path: Path) -> None:
    doctor_data["gradient_histograms"]["activations"] = {"exponent_lo": 0, "counts": []}
    fig = gradient_figure(doctor_data)
    assert "no activation gradients recorded" in _texts(fig)
    doctor_data["gradient_histograms"]["weights"] = {"exponent_lo": 0, "counts": []}
    doctor_data["gradient_histograms"]["activations"] = {"exponent_lo": -20, "counts": [1, 2, 3]}
    fig = gradient_figure(doctor_data)
    assert "no weight gradients recorded" in _texts(fig) and "unscaled" in _legend(fig)
    assert [p.name for p in write_plots(doctor_data, tmp_path)] == [GRADIENT_PLOT, MODULE_PLOT]


def test_no_loss_scale_draws_no_outline(doctor_data: dict[str, Any]) -> None:
    doctor_data["loss_scale_log2"] = None
    legend = _legend(gradient_figure(doctor_data))
    assert "unscaled" in legend and not any("loss scale" in t for t in legend)


def test_missing_matplotlib_warns_and_writes_nothing(
    doctor_data: dict[str, Any], tmp_path: Path, block_import: Callable[[str], None], caplog: pytest.LogCaptureFixture
) -> None:
    block_import("matplotlib")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        assert write_plots(doctor_data, tmp_path) == []
    assert 'pip install "ampkit[bench]"' in caplog.text
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(AmpkitError, match="need matplotlib"):
        gradient_figure(doctor_data)
