"""benchmarks/engine_overhead.py: the smoke run at calibrated step times writes a table and JSON that agree,
and the calibration converges on the width whose step takes the target time."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ampkit


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("engine_overhead", monkeypatch)


def test_smoke_run_at_two_step_times_prints_and_writes_the_same_rows(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # CPU only: the GPU suite runs this script itself on the GPU (16-mixed there: fused AdamW under GradScaler).
    mixed_policy = "bf16-mixed"
    out = tmp_path / "overhead.json"
    script.main(["--device", "cpu", "--smoke", "--precision", f"32-true,{mixed_policy}", "--step-ms", "2,20", "--json", str(out)])

    data = json.loads(out.read_text())
    rows = data["results"]
    assert [(r["target_ms"], r["precision"]) for r in rows] == [(t, p) for t in (2.0, 20.0) for p in ("32-true", mixed_policy)]
    for r in rows:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("hand_ms", "engine_ms")), r
        assert r["ratio"] == pytest.approx(r["engine_ms"] / r["hand_ms"])
        assert r["steps_each"] == data["args"]["rounds"] * data["args"]["steps"]
        assert r["width"] >= 8 and r["batch"] >= 1
        # one step of each side counted: the engine's ops are the hand loop's (tests/unit/training/test_optimizer_step.py
        # holds the exact allowance) and neither side syncs with the host
        # (at most 5 more: the non-finite check every policy makes, see ALLOWANCE_UNSCALED there)
        assert 0 < r["ops_hand"] <= r["ops_engine"] <= r["ops_hand"] + 5 and r["syncs_hand"] == r["syncs_engine"] == 0
    printed = capsys.readouterr().out.strip().splitlines()
    table = [line for line in printed if line.startswith(("| 32-true", f"| {mixed_policy}"))]
    assert len(table) == len(rows) and printed[-1] == table[-1]
    # each row is printed as soon as it is measured: the second target's probes come after the first target's rows
    first_probe_of_20ms = next(i for i, line in enumerate(printed) if line.startswith("# probe") and "for 20 ms" in line)
    assert printed.index(table[1]) < first_probe_of_20ms
    for line, r in zip(table, rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:4] == [r["precision"], f"{r['target_ms']:g}", str(r["width"]), str(r["batch"])]
        assert cells[4:7] == [f"{r['hand_ms']:.3f}", f"{r['engine_ms']:.3f}", f"{r['ratio']:.3f}"]
        assert cells[8:] == [str(r["ops_hand"]), str(r["ops_engine"]), "0 / 0"]


def test_without_step_ms_the_given_size_is_measured(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    report = script.main(["--smoke", "--precision", "bf16-mixed", "--width", "24", "--batch", "16"])
    (row,) = report["results"]
    assert (row["target_ms"], row["width"], row["batch"]) == (None, 24, 16)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| bf16-mixed | - | 24 | 16 |")


def _args(**overrides: object) -> argparse.Namespace:
    fields: dict[str, object] = {"width": 256, "batch": 128, "depth": 3, "clip": 1.0, "probes": 8, "probe_steps": 2}
    fields.update(overrides)
    return argparse.Namespace(**fields)


@pytest.mark.parametrize("target_ms, most_probes", [(0.2, 6), (0.5, 4), (2.0, 4), (20.0, 4), (300.0, 4)])
def test_calibration_finds_the_width_whose_step_takes_the_target(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, target_ms: float, most_probes: int
) -> None:
    # A device whose step costs a fixed 0.3 ms plus work growing as width**3 (batch in proportion to width).
    # Each probe costs device time, so the search must also be quick where the fixed part dominates.
    probed: list[int] = []

    def fake_probe(policy: object, width: int, args: object, device: object) -> float:
        probed.append(width)
        return 3e-4 + 1e-12 * width**3

    monkeypatch.setattr(script, "probe", fake_probe)
    width, batch = script.calibrate(ampkit.get_policy("32-true"), target_ms / 1e3, _args(), torch.device("cpu"))
    assert width in probed and len(probed) <= most_probes
    assert batch == script.batch_for(width, 128 / 256)
    achieved = fake_probe(None, width, None, None)
    if target_ms > 0.3:
        assert achieved == pytest.approx(target_ms / 1e3, rel=0.1)
    else:  # below the fixed cost no size gets there: the smallest width is the closest
        assert width == 8


@pytest.mark.parametrize("times, closest", [({256: 4e-3, 200: 2.5e-3}, 200), ({256: 2.5e-3, 240: 1e-3}, 256)])
def test_calibration_out_of_probes_returns_the_closest(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, times: dict[int, float], closest: int
) -> None:
    probed: list[int] = []

    def fake_probe(policy: object, width: int, args: object, device: object) -> float:
        probed.append(width)
        return times[width]

    monkeypatch.setattr(script, "probe", fake_probe)
    width, _ = script.calibrate(ampkit.get_policy("32-true"), 2e-3, _args(probes=2), torch.device("cpu"))
    assert probed == list(times) and width == closest  # for 2 ms, neither probe within 10%


def test_calibration_stops_when_its_time_is_spent(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # A device that never gets near the target: without a time budget the search would use every probe.
    probed: list[int] = []

    def fake_probe(policy: object, width: int, args: object, device: object) -> float:
        probed.append(width)
        return 1.0

    monkeypatch.setattr(script, "probe", fake_probe)
    script.calibrate(ampkit.get_policy("32-true"), 2e-3, _args(calibrate_s=0.0), torch.device("cpu"))
    assert len(probed) == 1


def test_a_spent_time_limit_reports_every_row_skipped(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    report = script.main(["--smoke", "--precision", "32-true,bf16-mixed", "--step-ms", "2,20", "--time-limit", "0"])
    assert [r["status"] for r in report["results"]] == ["skipped"] * 4
    assert all("time limit" in r["reason"] for r in report["results"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| bf16-mixed | 20 | skipped: not started")


@pytest.mark.parametrize("bad", ["2,x", "0", "-5"])
def test_bad_step_ms_says_what_to_give(script: ModuleType, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        script.main(["--step-ms", bad])
    assert "--step-ms" in capsys.readouterr().err
