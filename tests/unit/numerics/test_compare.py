"""One step under a policy against fp32: agreement, divergence measured against sampling noise, origins."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit.numerics._compare import compare_step, reference_step

_spec = importlib.util.spec_from_file_location("ampkit_test_fragile_c", Path(__file__).with_name("fragile.py"))
fragile = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(fragile)  # type: ignore[union-attr]
CE = nn.functional.cross_entropy


def _on(device: torch.device, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    # The batches are drawn on the CPU (fragile.batches) and moved, so every device sees the same values.
    return batch[0].to(device), batch[1].to(device)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))


def test_fp32_policy_agrees_exactly_even_with_dropout(device: torch.device) -> None:
    model, batch = _net().to(device), _on(device, fragile.batches()[0])
    ref = reference_step(model, batch, CE, seed=3)
    c = compare_step(model, batch, CE, "32-true", reference=ref)
    assert c.finite and c.diverging == [] and c.loss == ref.loss
    assert all(m.rel_error == 0.0 and m.cosine == pytest.approx(1.0) for m in c.modules.values())


def test_noise_is_the_disagreement_of_the_two_halves(device: torch.device) -> None:
    model, (x, y) = _net().to(device), _on(device, fragile.batches()[0])
    ref = reference_step(model, (x, y), CE)
    halves = []
    for rows in (slice(0, 32), slice(32, 64)):
        m = copy.deepcopy(model)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            CE(m(x[rows]), y[rows]).backward()
        halves.append(torch.cat([m[3].weight.grad.reshape(-1), m[3].bias.grad]))
    expected = float((halves[0] - halves[1]).norm() / (halves[0] + halves[1]).norm())
    assert ref.noise["3"] == pytest.approx(expected, rel=1e-5)


def test_bf16_rounding_stays_within_the_noise_and_a_lost_gradient_does_not(device: torch.device) -> None:
    model, batch = fragile.underflow_net().to(device), _on(device, fragile.batches()[0])
    ref = reference_step(model, batch, fragile.underflow_loss)
    bf16 = compare_step(model, batch, fragile.underflow_loss, "bf16-mixed", reference=ref)
    assert bf16.finite and bf16.diverging == []
    unscaled = compare_step(model, batch, fragile.underflow_loss, "16-mixed", reference=ref, loss_scale=1.0)
    lost = unscaled.modules["embed"]
    assert lost.cosine == 0.0 and lost.rel_error == 1.0 and lost.diverges
    assert unscaled.diverging[0] == "embed"


def test_forward_origin_is_the_innermost_layer_that_overflowed(device: torch.device) -> None:
    model, batch = fragile.overflow_net().to(device), _on(device, fragile.batches()[0])
    ref = reference_step(model, batch, CE)
    c = compare_step(model, batch, CE, "16-mixed", reference=ref, loss_scale=2.0**16)
    assert not c.finite and c.loss is None and c.forward_origin == "amplify"
    kept = compare_step(model, batch, CE, "16-mixed", keep_fp32=["amplify"], reference=ref, loss_scale=2.0**16)
    assert kept.finite and kept.forward_origin is None


def test_backward_overflow_is_located_when_the_forward_is_finite(device: torch.device) -> None:
    model, batch = _net().to(device), _on(device, fragile.batches()[0])
    ref = reference_step(model, batch, CE)
    c = compare_step(model, batch, CE, "16-mixed", reference=ref, loss_scale=2.0**40)  # far above what fits
    assert c.forward_origin is None and c.loss is not None
    assert not c.finite and c.backward_origin is not None
    assert all(m.nonfinite for m in c.modules.values() if m.diverges)


def test_the_model_is_not_changed(device: torch.device) -> None:
    model, batch = fragile.overflow_net().to(device), _on(device, fragile.batches()[0])
    before = copy.deepcopy(model.state_dict())
    compare_step(model, batch, CE, "16-true-masters", reference=reference_step(model, batch, CE), loss_scale=1.0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.dtype == torch.float32 for p in model.parameters())
