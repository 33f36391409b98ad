"""StaticLossScaler: a constant scale that still detects overflow. Device-generic where a tensor is involved."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.scaling import DynamicLossScaler, ScalerConfig, StaticLossScaler
from ampkit.scaling._kernels import grads_of

INF = float("inf")


@pytest.mark.parametrize("scale", [1.0, 128.0, 3.0, 2.0**-5])
def test_scale_is_constant_through_updates(device, scale):
    s = StaticLossScaler(scale, device)
    for found in [0.0, 1.0, 1.0, 0.0, 1.0] + [0.0] * 20:
        s.update(torch.tensor(found, device=device))
        assert s.get_scale() == scale
    assert s.collapse_reason() is None


def test_default_scale_is_one():
    assert StaticLossScaler().get_scale() == 1.0


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, -128.0, INF, -INF, float("nan")])
def test_bad_scale_raises(bad):
    with pytest.raises(ValueError, match="scale"):
        StaticLossScaler(bad)


def test_scale_multiplies_the_loss(device):
    s = StaticLossScaler(128.0, device)
    loss = torch.tensor([0.5, -3.0, 1e-3], device=device)
    assert torch.equal(s.scale(loss), loss * 128.0)
    assert torch.equal(s.scale(torch.tensor(0.5, device=device)), torch.tensor(64.0, device=device))


def test_scaled_backward_then_unscale_recovers_the_gradients(device):
    # Control: plain backward. Treatment: scaled backward, then unscale_. Same weights, same input.
    torch.manual_seed(0)
    control = nn.Linear(5, 3).to(device)
    treatment = nn.Linear(5, 3).to(device)
    treatment.load_state_dict(control.state_dict())
    x = torch.randn(4, 5).to(device)
    control(x).square().mean().backward()
    s = StaticLossScaler(2.0**7, device)
    s.scale(treatment(x).square().mean()).backward()
    found = torch.zeros((), device=device)
    s.unscale_(grads_of(treatment.parameters()), found)
    assert found.item() == 0.0
    for pc, pt in zip(control.parameters(), treatment.parameters()):
        assert torch.equal(pc.grad, pt.grad)  # power-of-two scale: exact


def test_overflow_still_detected_and_check_does_not_unscale(device):
    s = StaticLossScaler(4.0, device)
    grads = [torch.tensor([8.0, INF], device=device)]
    found = torch.zeros((), device=device)
    s.check_(grads, found)
    assert found.item() == 1.0
    assert grads[0][0].item() == 8.0
    found.zero_()
    s.unscale_(grads, found)
    assert found.item() == 1.0
    assert grads[0][0].item() == 2.0


def test_state_dict_round_trip(device):
    a = StaticLossScaler(3.0, device)
    state = a.state_dict()
    assert state == {"kind": "static", "scale": 3.0}
    b = StaticLossScaler(1.0, device)
    b.load_state_dict(state)
    assert b.get_scale() == 3.0
    assert torch.equal(b.scale(torch.tensor(2.0, device=device)), torch.tensor(6.0, device=device))


def test_loading_dynamic_state_into_static_raises(device):
    dyn = DynamicLossScaler(ScalerConfig(init_scale=8.0), device)
    s = StaticLossScaler(4.0, device)
    with pytest.raises(ValueError, match="dynamic"):
        s.load_state_dict(dyn.state_dict())
    assert s.get_scale() == 4.0  # untouched
