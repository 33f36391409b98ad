"""Tests for the profile's report.md: what ran, every section's figures as profile.json holds them, the plots and
the trace linked from where the report lives, and profiles with sections missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampkit.profile._report import REPORT_NAME, render_report, write_report


def test_what_ran_and_where(profile_data: dict[str, Any], tmp_path: Path) -> None:
    path = write_report(profile_data, tmp_path / "prof", [])
    text = path.read_text()
    assert path == tmp_path / "prof" / REPORT_NAME
    assert text.splitlines()[0] == "# ampkit profile: digits-aug (size small)"
    for needle in ("AMD EPYC 9R14 (2 cores)", "torch 2.13.0+cpu", "ampkit 0.9.0", "date 2026-11-24T15:40:00Z",
                   "```sh\nampkit profile -w digits-aug --out prof/\n```", "bf16-mixed", "12 steps measured"):  # fmt: skip
        assert needle in text, needle


def test_phases_largest_first_with_their_share(profile_data: dict[str, Any]) -> None:
    text = render_report(profile_data)
    data = profile_data["phases"]["data"]
    assert f"| data | {data['median_s'] * 1e3:.0f} ms | {data['share'] * 100:.1f}% | waiting for the next batch" in text
    rows = [line.split(" | ")[0].lstrip("| ") for line in text.splitlines() if line.startswith("| ") and "ms |" in line]
    phases = profile_data["phases"]
    assert rows[:6] == sorted(phases, key=lambda p: -phases[p]["share"])


def test_every_sync_site_trial_and_piece_of_advice(profile_data: dict[str, Any]) -> None:
    text = render_report(profile_data)
    for site in profile_data["syncs"]["sites"]:
        line = next(line for line in text.splitlines() if site["where"] in line)
        assert f"`{site['code']}`" in line and f"| {site['count']} |" in line
    for trial in profile_data["trials"]:
        name = trial["name"].replace("_", "\\_")
        line = next(line for line in text.splitlines() if line.startswith(f"| {name}"))
        assert f"| {trial['speedup']:.2f}x |" in line
    assert "1. **input pipeline:** 66% of the step waits for data" in text
    assert "   - measured: 2.40x faster step (0.180 s -> 0.075 s)" in text
    assert "   - confirm with: `ampkit bench --precision bf16-mixed,bf16-true --compile`" in text
    assert "Casts: 8.0% of forward + backward (124 cast ops per step)." in text
    assert "Profiler overhead (a window's median step over the plain window's; 1.00x: no cost), against the plain 170 ms: phases timed 1.07x, syncs counted 1.20x, torch.profiler 2.00x." in text


def test_plots_and_trace_linked_from_the_report(profile_data: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "my prof"
    out.mkdir()
    plot = out / "phases.png"
    plot.write_bytes(b"")
    profile_data["trace"] = str(out / "trace.json")  # absolute: linked relative to the report
    text = write_report(profile_data, out, [plot]).read_text()
    assert "![phases](phases.png)" in text
    assert "[trace.json](trace.json)" in text
    profile_data["trace"] = "traces/step trace.json"  # relative: already relative to the output directory
    assert "[step trace.json](traces/step%20trace.json)" in render_report(profile_data, out)


def test_a_code_cell_keeps_its_pipe_inside_the_cell(profile_data: dict[str, Any]) -> None:
    profile_data["syncs"]["sites"][0]["code"] = "flag = bool(a | b)"
    line = next(line for line in render_report(profile_data).splitlines() if "sched.py:17" in line)
    assert "`flag = bool(a \\| b)`" in line and line.count(" | ") == 4  # five cells


def test_missing_sections(profile_data: dict[str, Any], tmp_path: Path) -> None:
    for key in ("device_idle", "syncs", "ops", "overhead", "trace"):
        profile_data[key] = None
    profile_data["trials"] = []
    del profile_data["advice"]
    text = write_report(profile_data, tmp_path, None).read_text()
    assert "waiting for the next batch" in text
    for absent in ("## Host syncs", "## Op shares", "## Input-pipeline trials", "## Advice", "## Plots", "## Chrome trace",
                   "## Profiler overhead", "Device idle"):  # fmt: skip
        assert absent not in text
    bare = render_report({})
    assert bare.startswith("# ampkit profile\n") and "No phase times were recorded." in bare


def test_device_idle_when_measured(profile_data: dict[str, Any]) -> None:
    profile_data["device_idle"] = {"share": 0.41, "seconds_per_step": 0.07}
    assert "Device idle: 41.0% of the step (70.0 ms per step) with no kernel running." in render_report(profile_data)
