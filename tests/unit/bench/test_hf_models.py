"""A Hugging Face model (dict batches, a ModelOutput with .loss) through the bench: the Python API and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ampkit.bench import bench_model
from ampkit.cli._main import main
from ampkit.workloads._user import load_factory


def test_bench_model_trains_a_gpt2_from_its_own_loss_matching_the_fp32_control(hf_gpt2: str) -> None:
    model, data = load_factory(f"{hf_gpt2}:model", "--model")(), load_factory(f"{hf_gpt2}:data", "--data")()
    result = bench_model(model, data, "bf16-mixed", steps=3, warmup=1, rounds=1, device="cpu", seed=0)
    ref, mixed = result.runs
    assert result.workload == "GPT2LMHeadModel" and (ref.precision, mixed.precision) == ("32-true", "bf16-mixed")
    assert ref.status == mixed.status == "ok" and ref.throughput_unit == "tokens"
    assert result.settings["batch_items"] == 8 * 32  # input_ids.numel(): padding included
    # Control: the same weights, the first batch and the same dropout masks (the run seeds the RNG with seed=0).
    torch.manual_seed(0)
    model.train()
    control = model(**data.train[0]).loss.item()
    assert ref.losses[0] == pytest.approx(control, rel=1e-6)
    assert abs(mixed.losses[0] - control) < 0.02 * control  # bf16 rounding, not another loss
    # The eval metric is the model's own .loss over the held-out batches, after 3 steps: below the untrained loss.
    assert ref.eval_metric_name == "eval_loss" and 0 < ref.eval_metric < control


def test_cli_bench_runs_the_example_factories_and_names_the_model(hf_gpt2: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["bench", "--model", f"{hf_gpt2}:model", "--data", f"{hf_gpt2}:data", "--precision", "bf16-mixed",
            "--steps", "3", "--warmup", "1", "--rounds", "1", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "GPT2LMHeadModel" in printed and "user" not in printed
    data = json.loads((out / "results.json").read_text())
    assert data["workload"] == "GPT2LMHeadModel" and [r["status"] for r in data["runs"]] == ["ok", "ok"]
    assert data["workload_info"]["model_class"] == "GPT2LMHeadModel"
