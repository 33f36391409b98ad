"""The tune's pictures draw the table's rows and the guard's runs: checked on the data handed to the figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ampkit.tuning import TuneResult, _plots as plots, rows


def _spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real = getattr(plots, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(plots, name, spy)
    return calls


def test_speed_against_memory_draws_one_point_per_table_row_with_both_figures(
    measured: TuneResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch, "speed_memory_figure")
    plots.write_plots(measured, tmp_path)
    (points, left_out), _ = calls[0]
    table = rows(measured)
    drawable = [r for r in table if r["peak_memory_bytes"] is not None and r["verdict"] not in ("failed", "cut")]
    assert [(p.configuration, p.peak_memory_bytes, p.speedup, p.interval, p.verdict) for p in points] == [
        (r["configuration"], r["peak_memory_bytes"], r["speedup"], r["interval"], r["verdict"]) for r in drawable
    ]
    assert {p.verdict for p in points} == {"winner", "rejected", "start", "slower", "no gain"}
    assert next(p for p in points if p.verdict == "start").interval is None  # the control has no interval of its own
    assert left_out == [("precision bf16-mixed, compile regional", "no peak memory measured (a compiled step on a CPU)"),
                        ("fused step on", "its trial failed")]
    assert len(points) + len(left_out) == len(table)  # every row drawn or named


def test_the_winner_and_the_rejected_are_marked_apart_from_the_rest(measured: TuneResult) -> None:
    points, left_out = plots.speed_points(measured)
    fig = plots.speed_memory_figure(points, left_out, title="toy", run_steps=1000)
    markers = {c.get_label(): c.lines[0].get_marker() for c in fig.axes[0].containers}
    assert markers["winner"] == "*" and markers["rejected"] == "X"
    assert len({markers["winner"], markers["rejected"], markers["start"], markers["no gain"]}) == 4


def test_the_loss_curves_are_the_guards_runs_reference_and_its_noise_first(
    measured: TuneResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spy(monkeypatch, "loss_figure")
    plots.write_plots(measured, tmp_path)
    (curves,), _ = calls[0]
    ref = measured.reference
    assert ref is not None
    assert [(c.label, list(c.losses), c.kind) for c in curves] == [
        ("fp32 reference (the start)", ref.losses, "reference"),
        ("fp32, batches reordered (its noise)", ref.reordered_losses, "reordered"),
        ("precision bf16-mixed (winner)", measured.guard[measured.winner.numerics_key].losses, "winner"),
        ("precision bf16-true (rejected)", [2.0, 1.9, 1.9, 1.8], "rejected"),
    ]


def test_a_tune_without_guard_runs_draws_an_empty_picture_that_says_so(measured: TuneResult) -> None:
    measured.reference, measured.guard = None, {}
    assert plots.loss_curves(measured) == []
    fig = plots.loss_figure([], title="toy")
    assert [t.get_text() for t in fig.axes[0].texts] == ["no accuracy-guard runs (the guard ran no finalist)"]
