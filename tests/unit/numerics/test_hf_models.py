"""The doctor on a Hugging Face model: dict batches, the ModelOutput's own .loss, the model named by its class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ampkit.cli._main import main
from ampkit.numerics import diagnose
from ampkit.policy import get_policy
from ampkit.workloads._user import load_factory


def test_diagnose_compares_against_the_models_own_fp32_loss(hf_gpt2: str, device: torch.device) -> None:
    if not get_policy("bf16-mixed").support(device).supported:
        pytest.skip(f"bf16-mixed does not run on {device}: {get_policy('bf16-mixed').support(device).reason}")
    model, data = load_factory(f"{hf_gpt2}:model", "--model")(), load_factory(f"{hf_gpt2}:data", "--data")()
    batches = data.train[:2]  # on the CPU, as the factory gives them: diagnose(device=...) moves them
    d = diagnose(model, batches, steps=1, target="bf16-mixed", device=device)  # default loss: the output's .loss
    assert d.context["device"] == str(device)
    model.to(device).train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)  # the doctor seeds each compared step with seed=0: the same dropout masks
        control = model(**{k: v.to(device) for k, v in batches[1].items()}).loss.item()  # no optimizer: the initial weights
    for c in d.comparisons:
        assert c.reference_loss == pytest.approx(control, rel=1e-6)
        assert c.loss is not None and abs(c.loss - control) < 0.02 * control
    assert d.recommended_precision == "bf16-mixed"


# CI time (2026-11-28): slow tier. CI runs the doctor's CLI on the built-in workloads (tests/unit/cli/test_doctor.py)
# and the HF model's memory and bench paths in tests/unit/memory/test_hf_models.py and tests/unit/bench/test_hf_models.py.
@pytest.mark.slow
def test_cli_doctor_runs_the_example_and_names_the_model(hf_gpt2: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "doc"
    argv = ["doctor", "--model", f"{hf_gpt2}:model", "--data", f"{hf_gpt2}:data", "--steps", "1", "--precision", "bf16-mixed",
            "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "doctor.json").read_text())
    assert data["workload"]["name"] == "GPT2LMHeadModel" and data["recommended_precision"] == "bf16-mixed"
    assert "GPT2LMHeadModel" in capsys.readouterr().out
