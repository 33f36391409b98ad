"""A Hugging Face model (dict batch, ModelOutput with .loss) through estimate, ampkit memory and recompute."""

from __future__ import annotations

import json

import pytest
import torch

from ampkit import recompute
from ampkit.cli._main import main
from ampkit.memory import estimate, measure
from ampkit.workloads._user import load_factory


def _gpt2(spec: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return load_factory(f"{spec}:model", "--model")(), load_factory(f"{spec}:data", "--data")().train[0]


def test_estimate_on_fake_tensors_equals_the_measured_step(hf_gpt2: str) -> None:
    model, batch = _gpt2(hf_gpt2)
    adamw = lambda p: torch.optim.AdamW(p)
    for policy in ("32-true", "bf16-mixed"):
        predicted, measured = estimate(model, batch, adamw, policy), measure(model, batch, adamw, policy)
        assert (predicted.total, predicted.peak, predicted.batch_size) == (measured.total, measured.peak, 8)
        assert predicted.activations > 0


def test_cli_memory_json_matches_the_library_on_the_example(hf_gpt2: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", "--model", f"{hf_gpt2}:model", "--data", f"{hf_gpt2}:data", "--precision", "32-true,bf16-mixed", "--device", "cpu"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    model, batch = _gpt2(hf_gpt2)
    control = measure(model, batch, lambda p: torch.optim.AdamW(p, fused=True), "bf16-mixed", clip_grad_norm=1.0)
    assert rows[1]["precision"] == "bf16-mixed" and rows[1]["total"] == control.total
    assert rows[1]["activations"] < rows[0]["activations"]
    assert main(argv) == 0
    assert "ampkit memory: GPT2LMHeadModel, batch 8" in capsys.readouterr().out


def test_recompute_finds_the_gpt2_blocks_and_keeps_loss_and_gradients(hf_gpt2: str) -> None:
    model, batch = _gpt2(hf_gpt2)

    def loss_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)  # the same dropout masks: checkpoint replays the RNG for the recomputation
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    control_loss, control_grads = loss_and_grads()
    report = recompute(model, "auto", example_batch=batch)
    assert report.modules == ("transformer.h.0", "transformer.h.1")
    assert report.activations_after < 0.5 * report.activations_before
    loss, grads = loss_and_grads()
    assert torch.equal(loss, control_loss)
    assert all(torch.allclose(g, c, rtol=1e-5, atol=1e-7) for g, c in zip(grads, control_grads))
