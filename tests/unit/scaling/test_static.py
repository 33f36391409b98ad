"""StaticLossScaler: a constant scale that still detects overflow."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.scaling import DynamicLossScaler, ScalerConfig, StaticLossScaler
from ampkit.scaling.kernels import grads_of

INF = float("inf")


@pytest.mark.parametrize("scale", [1.0, 128.0, 3.0, 2.0**-5])
def test_scale_is_constant_through_updates(scale):
    s = StaticLossScaler(scale)
    for found in [0.0, 1.0, 1.0, 0.0, 1.0] + [0.0] * 20:
        s.update(torch.tensor(found))
        assert s.get_scale() == scale
    assert s.collapse_reason() is None


def test_default_scale_is_one():
    assert StaticLossScaler().get_scale() == 1.0


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, -128.0, INF, -INF, float("nan")])
def test_bad_scale_raises(bad):
    with pytest.raises(ValueError, match="scale"):
        StaticLossScaler(bad)


def test_scale_multiplies_the_loss():
    s = StaticLossScaler(128.0)
    loss = torch.tensor([0.5, -3.0, 1e-3])
    assert torch.equal(s.scale(loss), loss * 128.0)
    assert torch.equal(s.scale(torch.tensor(0.5)), torch.tensor(64.0))


def test_scaled_backward_then_unscale_recovers_the_gradients():
    # Control: plain backward. Treatment: scaled backward, then unscale_. Same weights, same input.
    torch.manual_seed(0)
    control = nn.Linear(5, 3)
    treatment = nn.Linear(5, 3)
    treatment.load_state_dict(control.state_dict())
    x = torch.randn(4, 5)
    control(x).square().mean().backward()
    s = StaticLossScaler(2.0**7)
    s.scale(treatment(x).square().mean()).backward()
    found = torch.zeros(())
    s.unscale_(grads_of(treatment.parameters()), found)
    assert found.item() == 0.0
    for pc, pt in zip(control.parameters(), treatment.parameters()):
        assert torch.equal(pc.grad, pt.grad)  # power-of-two scale: exact


def test_overflow_still_detected_and_check_does_not_unscale():
    s = StaticLossScaler(4.0)
    grads = [torch.tensor([8.0, INF])]
    found = torch.zeros(())
    s.check_(grads, found)
    assert found.item() == 1.0
    assert grads[0][0].item() == 8.0
    found.zero_()
    s.unscale_(grads, found)
    assert found.item() == 1.0
    assert grads[0][0].item() == 2.0


def test_state_dict_round_trip():
    a = StaticLossScaler(3.0)
    state = a.state_dict()
    assert state == {"kind": "static", "scale": 3.0}
    b = StaticLossScaler(1.0)
    b.load_state_dict(state)
    assert b.get_scale() == 3.0
    assert torch.equal(b.scale(torch.tensor(2.0)), torch.tensor(6.0))


def test_loading_dynamic_state_into_static_raises():
    dyn = DynamicLossScaler(ScalerConfig(init_scale=8.0))
    s = StaticLossScaler(4.0)
    with pytest.raises(ValueError, match="dynamic"):
        s.load_state_dict(dyn.state_dict())
    assert s.get_scale() == 4.0  # untouched
