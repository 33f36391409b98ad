"""benchmarks/cnn_throughput.py: its smoke run writes a table and JSON that agree, it leaves torch's switches as
it found them, and its own ResNet-50 is torchvision's network."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "cnn_throughput.py"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cnn_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, spec.name, module)  # type: ignore[union-attr]  # dataclasses look it up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


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
    # each warm-up is printed the moment it ends, before the table: a run cut at its limit keeps them
    assert sum(line.startswith("# warm-up ") for line in lines[: -2 - len(results)]) == len(ok)


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
