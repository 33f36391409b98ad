"""Tests for the profile's pictures: each step's bar is its phases and sums to its total, the trials' bars and
speed-ups, and profiles with sections missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ampkit.profile._plots import PHASES_PLOT, TRIALS_PLOT, UNATTRIBUTED, phases_figure, trials_figure, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bars(ax) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """The bar patches of ``ax`` by the label of their container (a phase)."""
    return {c.get_label(): list(c.patches) for c in ax.containers}


def test_each_step_is_one_bar_of_its_phases_summing_to_its_total(profile_data: dict[str, Any]) -> None:
    ax = phases_figure(profile_data).axes[0]
    steps = profile_data["per_step"]
    bars = _bars(ax)
    assert list(bars) == list(profile_data["phases"])  # stacked bottom to top in the order the phases happen
    for name, patches in bars.items():
        assert [p.get_height() for p in patches] == pytest.approx([s[name] * 1e3 for s in steps])
        assert [p.get_x() + p.get_width() / 2 for p in patches] == pytest.approx(range(1, len(steps) + 1))
    tops = np.max([[p.get_y() + p.get_height() for p in patches] for patches in bars.values()], axis=0)
    assert tops == pytest.approx([s["total"] * 1e3 for s in steps])
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == pytest.approx(profile_data["step_s"]["median"] * 1e3)
    assert [t.get_text() for t in ax.get_legend().get_texts()][1:] == list(profile_data["phases"])


def test_a_step_whose_phases_fall_short_is_topped_up_to_its_total(profile_data: dict[str, Any]) -> None:
    for step in profile_data["per_step"]:
        step["total"] += 0.010  # 10 ms the phases did not account for
    bars = _bars(phases_figure(profile_data).axes[0])
    assert [p.get_height() for p in bars[UNATTRIBUTED]] == pytest.approx([10.0] * len(profile_data["per_step"]))


def test_trials_bars_speedups_and_baseline(profile_data: dict[str, Any]) -> None:
    ax = trials_figure(profile_data).axes[0]
    trials = profile_data["trials"]
    bars = _bars(ax)
    ends = np.max([[p.get_x() + p.get_width() for p in patches] for patches in bars.values()], axis=0)
    assert ends == pytest.approx([t["step_s"] * 1e3 for t in trials])  # each bar ends at its step time
    # The wait for data, then the rest of the step (the whole bar for a trial without phases).
    assert [p.get_width() for p in bars[UNATTRIBUTED]] == pytest.approx([60.0, 60.0, trials[2]["step_s"] * 1e3])
    assert [p.get_width() for p in bars["data"]] == pytest.approx([120.0, 21.0, 0.0])
    assert [t.get_text() for t in ax.texts] == ["1.00x", "2.22x", "2.40x"]
    assert next(t.get_text() for t in ax.get_yticklabels()) == "as given\n(baseline)"
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == 1 and dotted[0].get_xdata()[0] == pytest.approx(180.0)


def test_write_plots_writes_pngs_and_leaves_out_trials_when_none(profile_data: dict[str, Any], tmp_path: Path) -> None:
    paths = write_plots(profile_data, tmp_path)
    assert [p.name for p in paths] == [PHASES_PLOT, TRIALS_PLOT]
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in paths)
    profile_data["trials"] = []
    assert [p.name for p in write_plots(profile_data, tmp_path / "none")] == [PHASES_PLOT]
    del profile_data["trials"]
    assert [p.name for p in write_plots(profile_data, tmp_path / "absent")] == [PHASES_PLOT]


def test_missing_sections_give_the_placeholder() -> None:
    for data in ({}, {"per_step": None, "phases": None, "step_s": None}, {"per_step": []}):
        ax = phases_figure(data).axes[0]
        assert [t.get_text() for t in ax.texts] == ["no per-step times"] and not ax.patches
    ax = trials_figure({"trials": [{"name": "x", "step_s": None}]}).axes[0]
    assert [t.get_text() for t in ax.texts] == ["no trials"]


def test_median_line_falls_back_to_the_bars(profile_data: dict[str, Any]) -> None:
    del profile_data["step_s"], profile_data["phases"]
    ax = phases_figure(profile_data).axes[0]
    totals = [s["total"] * 1e3 for s in profile_data["per_step"]]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed[0].get_ydata()[0] == pytest.approx(float(np.median(totals)))
    assert list(_bars(ax)) == ["data", "copy", "forward", "backward", "optimizer", "other"]  # the per-step keys' order
