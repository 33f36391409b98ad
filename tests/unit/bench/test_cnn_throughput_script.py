"""benchmarks/cnn_throughput.py: its smoke run writes a table and JSON that agree, it leaves torch's switches as
it found them, and its own ResNet-50 is torchvision's network."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("cnn_throughput", monkeypatch)


def test_smoke_run_prints_the_table_last_and_writes_the_same_figures(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # CPU only: the GPU suite runs this script itself on the GPU.
    device = torch.device("cpu")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    out = tmp_path / "cnn.json"
    script.main(["--device", str(device), "--smoke", "--rounds", "1", "--json", str(out)])
    assert torch.backends.cudnn.benchmark is False  # the run turned it on and must restore it

    data = json.loads(out.read_text())
    results, batch = data["results"], data["args"]["batch"]
    assert list(results) == [c.name for c in script.CONTENDERS]
    ok = {name: r for name, r in results.items() if r["status"] == "ok"}
    assert {"FP32", "AMP bf16", "Engine bf16-mixed"} <= set(ok)
    fp32 = ok["FP32"]["step_ms"]
    assert list(results)[-1] == "FP32"  # last: its warm-up is the slowest on a GPU
    for name, r in ok.items():
        assert math.isfinite(r["step_ms"]) and r["step_ms"] > 0, name
        assert 0 < r["first_step_s"] <= r["warmup_s"], name  # the warm-up's cost, reported apart
        assert r["steps_timed"] == data["args"]["rounds"] * data["args"]["steps"]
        assert r["images_per_s"] == pytest.approx(batch * 1e3 / r["step_ms"])
        assert r["vs_fp32"] == pytest.approx(fp32 / r["step_ms"])  # against this run's own FP32 row
    tf32 = results["TF32"]
    if device.type == "cpu":
        assert tf32["status"] == "n/a" and "CUDA" in tf32["reason"] and all("vs_tf32" not in r for r in ok.values())
    elif tf32["status"] == "ok":
        assert tf32["tf32"] and not ok["FP32"]["tf32"] and tf32["vs_tf32"] == pytest.approx(1.0)

    lines = capsys.readouterr().out.strip().splitlines()
    table = lines[-2 - len(results):]
    assert table[0].startswith("| contender | TF32 | cuDNN search | step (ms) |")
    for row, (name, r) in zip(table[2:], results.items()):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0] == name
        assert cells[3] == (f"{r['step_ms']:.1f}" if r["status"] == "ok" else "")
        if r["status"] == "ok":
            assert cells[7] == f"{r['first_step_s']:.2f}"
    # before it, each contender's row as it was measured (its warm-up and first round): a run cut at its limit keeps them
    as_measured = [line for line in lines[: -2 - len(results)] if line.startswith("| ") and _cells(line)[0] in results]
    assert [_cells(line)[0] for line in as_measured] == list(results)
    for line in as_measured:
        r = results[_cells(line)[0]]
        if r["status"] == "ok":
            assert _cells(line)[3:] == [f"{r['first_step_s']:.2f}", f"{r['warmup_s']:.2f}", f"{r['first_round_ms']:.1f}"]


def test_each_contenders_row_is_printed_before_the_next_contender_starts(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The 2026-11-28 H200 run was killed during the second contender's warm-up with only a comment line in its log:
    # each contender's row (its warm-up and first round) must be in the log before the next one starts, under a
    # table head, with nothing between the rows (the suite's summary shows the last table of the log). Steps faked:
    # only the printing is under test here.
    def fake_make_step(c: object, model: object, x: object, y: object, device: object) -> Callable[[], None]:
        printed = capsys.readouterr().out
        started.append((c.name, printed))  # type: ignore[attr-defined]
        return lambda: None

    started: list[tuple[str, str]] = []
    monkeypatch.setattr(script, "make_step", fake_make_step)
    out = tmp_path / "cnn.json"
    script.main(["--device", "cpu", "--smoke", "--rounds", "2", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    ok = [name for name, r in results.items() if r["status"] == "ok"]
    assert [name for name, _ in started] == ok
    log = "".join(printed for _, printed in started) + capsys.readouterr().out
    as_measured = re.search(r"^\| contender, first round as measured \|.*\n\|[-|: ]+\|\n((?:\|.*\n)+)", log, re.MULTILINE)
    assert as_measured, log
    rows = as_measured.group(1).splitlines()
    assert [_cells(row)[0] for row in rows] == list(results)  # every contender, in order, contiguous
    for (name, printed), earlier in zip(started[1:], ok):
        assert f"| {earlier} |" in "".join(p for _, p in started[: ok.index(name) + 1]), f"{earlier}'s row came after {name} started"
    for row in rows:
        r = results[_cells(row)[0]]
        if r["status"] == "ok":
            assert _cells(row)[3:6] == [f"{r['first_step_s']:.2f}", f"{r['warmup_s']:.2f}", f"{r['first_round_ms']:.1f}"]
    assert log.rstrip().splitlines()[-1].startswith("| FP32 |")  # then the table over every round, last


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_a_spent_time_limit_skips_the_contenders_not_started_and_still_prints_the_table(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cnn.json"
    script.main(["--device", "cpu", "--smoke", "--time-limit", "0", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert {r["status"] for r in results.values()} == {"skipped", "n/a"}  # n/a: TF32, a CUDA mode
    assert all("time limit" in r["reason"] for r in results.values() if r["status"] == "skipped")
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("| FP32 | skipped: not started")


def test_switches_come_back_when_the_run_fails(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)

    def broken(args: object, device: torch.device, deadline: object) -> None:
        script.set_tf32(not before[1])
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(script, "measure", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        script.main(["--device", "cpu", "--smoke"])
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark) == before


def test_own_resnet50_has_torchvisions_size_and_shapes(script: ModuleType) -> None:
    model = script.ResNet50()
    # torchvision documents ResNet50_Weights.IMAGENET1K_V1 with num_params 25,557,032.
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


def test_own_resnet50_computes_what_torchvisions_computes(script: ModuleType, device: torch.device) -> None:
    models = pytest.importorskip("torchvision.models", reason="Requires: torchvision (the GPU machine has it)")
    control, ours = models.resnet50(weights=None), script.ResNet50()
    ours.load_state_dict(control.state_dict())  # strict: the same names and shapes
    control, ours = control.to(device).eval(), ours.to(device).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)).to(device)
    # Plain fp32, deterministic cuDNN: the same layers in the same order then give the same numbers, so only an
    # architectural difference could move them.
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        torch.testing.assert_close(ours(x), control(x), rtol=1e-5, atol=1e-5)
