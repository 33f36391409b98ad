"""Tests for the profile's terminal view: each section's figures as profile.json holds them, and missing sections."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ampkit.profile._table import (
    TOP_SYNCS,
    advice_parts,
    header_lines,
    overhead_line,
    phase_rows,
    render,
    sync_rows,
    trial_rows,
)


def _render(data: dict[str, Any], width: int = 160) -> str:
    console = Console(file=io.StringIO(), width=width)
    render(data, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_header_names_workload_device_precision_steps_and_median(profile_data: dict[str, Any]) -> None:
    title, description, facts = header_lines(profile_data)
    assert title == "ampkit profile: digits-aug (size small)"
    assert description == profile_data["workload"]["description"]
    median_ms = f"{profile_data['step_s']['median'] * 1e3:.0f} ms"
    for part in ("device cpu (AMD EPYC 9R14 (2 cores))", "bf16-mixed", "12 steps measured", f"median step {median_ms}"):
        assert part in facts
    profile_data["accumulate"] = 4  # the Profiler counts optimizer steps: each of 4 batches here
    assert "12 optimizer steps of 4 batches measured" in header_lines(profile_data)[-1]


def test_a_sync_inside_a_library_is_shown_at_the_users_line_via_the_librarys(profile_data: dict[str, Any]) -> None:
    profile_data["syncs"]["sites"] = [{"where": "train.py:30 in loop", "op": "item", "count": 12, "per_step": 1.0, "code": "out = model(x)",
                                       "via": "masking_utils.py:321 in sdpa_mask", "via_code": "if mask.all():"}]  # fmt: skip
    assert sync_rows(profile_data).rows[0][0] == "train.py:30 in loop, via masking_utils.py:321 in sdpa_mask"


def test_phases_largest_share_first_with_its_percent(profile_data: dict[str, Any]) -> None:
    rows = phase_rows(profile_data).rows
    phases = profile_data["phases"]
    expected = sorted(phases, key=lambda p: -phases[p]["share"])
    assert [r[0] for r in rows] == expected and expected[0] == "data"
    assert rows[0][2] == f"{phases['data']['share'] * 100:.1f}%"
    assert rows[0][3].startswith("waiting for the next batch")
    text = _render(profile_data)
    # In the terminal too, data comes before the smaller phases.
    assert text.index("waiting for the next batch") < text.index("the backward pass") < text.index("host-to-device copy")


def test_every_section_is_shown(profile_data: dict[str, Any]) -> None:
    profile_data["device_idle"] = {"share": 0.41, "seconds_per_step": 0.07}
    text = _render(profile_data)
    for needle in (
        "Device idle: 41.0% of the step (70.0 ms per step)",
        "Host syncs: 2 per step, at 2 places in the code.",
        "train.py:42 in train", "print(loss.item())", "lr = float(warm[step])",  # the [ is not taken for rich markup
        "Casts: 8.0% of forward + backward (124 cast ops per step).", "Optimizer: 15 ops per step (5.0% of the step).",
        "as given (baseline)", "2.22x", "2.40x",
        "1. input pipeline: 66% of the step waits for data", "measured: 2.40x faster step",
        "3. casts:", "confirm with: ampkit bench --precision bf16-mixed,bf16-true --compile",
        "Profiler overhead (a window's median step over the plain window's; 1.00x: no cost)", "phases timed 1.07x, syncs counted 1.20x,",
    ):  # fmt: skip
        assert needle in text, needle


def test_trials_show_measured_step_steady_step_epoch_start_and_speedup(profile_data: dict[str, Any]) -> None:
    rows = trial_rows(profile_data).rows
    assert rows == [
        ["as given (baseline)", "180 ms", "178 ms", "121 ms", "1.00x"],
        ["num_workers=2", "81.0 ms", "62.0 ms", "310 ms", "2.22x"],
        ["num_workers=2, persistent_workers", "75.0 ms", "—", "—", "2.40x"],  # figures this trial lacks
    ]


def test_sync_sites_most_first_and_cut_at_top(profile_data: dict[str, Any]) -> None:
    sites = [{"where": f"loop.py:{i}", "op": "item", "count": i, "per_step": i / 12, "code": "x.item()"} for i in range(1, 9)]
    profile_data["syncs"] = {"per_step": 3.0, "sites": sites}
    rows = sync_rows(profile_data).rows
    assert [r[0] for r in rows] == [f"loop.py:{i}" for i in range(8, 8 - TOP_SYNCS, -1)]
    assert len(sync_rows(profile_data, top=None).rows) == 8
    assert f"... {8 - TOP_SYNCS} more in profile.json" in _render(profile_data)


def test_optional_sections_absent_or_none(profile_data: dict[str, Any]) -> None:
    for key in ("device_idle", "syncs", "ops", "overhead", "trace"):
        profile_data[key] = None
    profile_data["trials"] = []
    del profile_data["advice"]
    text = _render(profile_data)
    assert "waiting for the next batch" in text
    for absent in ("Device idle", "Host syncs", "Casts:", "Input-pipeline trials", "Advice:", "Profiler overhead"):
        assert absent not in text
    assert "No phase times were recorded." in _render({})
    assert header_lines({}) == ["ampkit profile", "device unknown"]


def test_advice_leaves_out_missing_parts() -> None:
    item = {"topic": "host syncs", "finding": "1 read-back per step", "change": "read it every 10 steps", "measured": None}
    assert advice_parts(item) == [("host syncs", "1 read-back per step"), ("change", "read it every 10 steps")]


def test_narrow_terminal_keeps_figures_whole(profile_data: dict[str, Any]) -> None:
    text = _render(profile_data, width=70)
    assert "…" not in text  # names and code wrap; no figure is cut short
    assert "ampkit bench --precision bf16-mixed,bf16-true --compile" in text  # the command stays on one line


def test_an_overhead_far_below_one_says_the_plain_steps_were_disturbed(profile_data: dict[str, Any]) -> None:
    """A measuring window only adds to a step, so a window faster than the plain step beyond the timed steps' own
    spread (p10-p90 of the median) is a disturbed plain window, not an overhead: the line says so, with no ratio."""
    step = profile_data["step_s"]
    noise = (step["p90"] - step["p10"]) / step["median"]
    plain = profile_data["overhead"]["plain_step_s"]
    assert 0 < noise < 0.5
    profile_data["overhead"]["plain_step_s"] = 4.0  # the plain window ran while something else held the cores
    line = overhead_line(profile_data)
    assert line is not None and "disturbed" in line and "0.05x" not in line and "x," not in line
    assert "phases timed" in line and "4,000 ms" in line
    assert "disturbed" in _render(profile_data)
    # The control: within the noise below 1 is still read as the overhead it is.
    profile_data["overhead"].update(plain_step_s=plain, profiled_step_s=plain * (1 - noise / 2), sync_step_s=None, trace_step_s=None)
    assert overhead_line(profile_data) == f"Profiler overhead (a window's median step over the plain window's; 1.00x: no cost), against the plain 170 ms: phases timed {1 - noise / 2:.2f}x."
    profile_data["overhead"]["profiled_step_s"] = plain * (1 - noise * 1.5)
    assert "disturbed" in overhead_line(profile_data)
