"""benchmarks/fp8_training.py: its smoke run (tiny GPTs on the CPU, torchao's fp8 emulation) writes every row, the
predicted columns are the roofline's own figures, and the fp8 rows' losses stay within fp8's tolerance of
bf16-mixed's (the control, same weights and batches). Its refusals: no torchao, a spent time limit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from ampkit.policy._fp8_roofline import predict_linear
from ampkit.policy._gpu_specs import gpu_spec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fp8_training.py"

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed (the fp8 extra)")


@pytest.fixture(scope="module")
def script(load_script: Callable[..., ModuleType]) -> ModuleType:
    return load_script("fp8_training")


@needs_torchao
def test_smoke_run_writes_every_row_and_fp8_trains_within_tolerance_of_bf16(script: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "fp8.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text(encoding="utf-8"))

    expected = [(spec.name, label) for spec in script.SMOKE_MODELS for label, _ in script.policies_for(spec, emulate=True)]
    assert sorted((r["model"], r["policy"]) for r in data["runs"]) == sorted(expected)
    for model in {r["model"] for r in data["runs"]}:
        rows = {r["policy"]: r for r in data["runs"] if r["model"] == model}
        control = rows["bf16-mixed"]
        assert control["status"] == "ok" and control["step_s"] > 0
        for label, row in rows.items():
            if label.endswith(" all"):  # every layer in emulated fp8: ran, computed something else, stayed close
                assert row["status"] == "ok" and row["fp8_layers"] == row["linear_layers"] > 0, row
                assert row["loss"] != control["loss"] and abs(row["loss"] - control["loss"]) < 0.01 * control["loss"], row
                # the gap is the mean per-step difference from the control over the loss window, with its noise
                w = row["loss_window"]
                diffs = [a - b for a, b in zip(row["losses"], control["losses"])]
                assert row["loss_diff_vs_bf16"] == pytest.approx(sum(diffs[-w:]) / w) == pytest.approx(row["loss"] - control["loss"])
                assert row["loss_diff_se"] >= 0 and row["loss_diff_early"] == pytest.approx(sum(diffs[:w]) / w)
                noise, late, early = 2 * row["loss_diff_se"], abs(row["loss_diff_vs_bf16"]), abs(row["loss_diff_early"])
                assert row["gap_trend"] == ("closes" if late < early - noise else "widens" if late > early + noise else "steady")
            elif label != "bf16-mixed":  # "auto" at 128 tokens: the roofline converts nothing, so it is not run again
                assert row["status"] == "skipped" and "converts no layer" in row["reason"], row

    layers = data["layers"]
    # Both smoke models are d_model 32 GPTs at 4 x 32 tokens: qkv, proj, the MLP's two, and the head.
    assert sorted((r["tokens"], r["in"], r["out"]) for r in layers) == sorted([(128, 32, 96), (128, 32, 32), (128, 32, 128), (128, 128, 32), (128, 32, 256)])
    for r in layers:
        cost = predict_linear(gpu_spec(r["planned_for"]), r["tokens"], r["in"], r["out"])
        assert (r["predicted_bf16_s"], r["predicted_fp8_s"], r["predicted_speedup"]) == (cost.bf16_s, cost.fp8_s, cost.speedup)
        assert r["filter_converts"] is cost.pays
        assert r["status"] == "ok" and r["measured_bf16_s"] > 0 and r["measured_fp8-tensorwise_s"] > 0
        # rowwise is measured only where the filter converts (none at 128 tokens): one compile less per shape
        assert "measured_fp8-rowwise_s" not in r and "filter keeps" in r["fp8-rowwise_skipped"]
        assert r["agrees"] is (r["filter_converts"] == (r["measured_fp8-tensorwise_speedup"] > 1))
    # the per-layer table is measured first, then the end-to-end runs (each printed the moment it is measured)
    assert done.stdout.index("| tokens x in x out |") < done.stdout.index("| model | policy |")
    assert "## Per Linear shape" in done.stdout and "## Where the end-to-end gain goes" in done.stdout and "timings mean nothing" in done.stdout


@needs_torchao
def test_a_spent_time_limit_reports_the_rows_it_did_not_start(script: ModuleType, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        assert script.main(["--smoke", "--time-limit", "0", "--json", str(tmp_path / "fp8.json")]) == 0
    finally:
        torch.set_num_threads(threads)  # the smoke run sets one thread for its tiny tensors
    data = json.loads((tmp_path / "fp8.json").read_text(encoding="utf-8"))
    assert data["runs"] and data["layers"]
    assert all(r["status"] == "skipped" and "time limit" in r["reason"] for r in data["runs"] + data["layers"])


def test_without_torchao_it_says_how_to_bring_the_wheel_and_exits_3(script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(script, "missing_torchao", lambda: "needs torchao: pip install 'ampkit[fp8]'")
    assert script.main(["--device", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "torchao==0.17.0" in err and "-d .whl" in err and "carry" in err


def test_a_row_that_raises_is_recorded_as_failed_and_the_others_go_on(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("CUDA error: misaligned address\nmore detail")

    assert script.attempt(broken, torch.device("cpu")) == {"status": "failed", "reason": "RuntimeError: CUDA error: misaligned address"}
    assert "Traceback" in capsys.readouterr().err
    assert script.attempt(lambda: {"step_s": 1.0}, torch.device("cpu")) == {"status": "ok", "step_s": 1.0}
