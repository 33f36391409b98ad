"""Weights loaded into the model after setup reach the fp32 masters (``ampkit.training._loaded_weights``): the
control is an engine set up on a model that held those weights from the start."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit import Engine


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))


def _step(engine: Engine, model: nn.Module) -> None:
    x = torch.ones(3, 4)
    with engine.autocast():
        loss = model(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()


@pytest.mark.parametrize("policy", ["bf16-true-masters", "16-true-masters", "bf16-true-remainder"])
def test_a_model_loaded_after_setup_trains_from_the_loaded_weights(policy: str) -> None:
    saved = _net(1)
    loaded = Engine(policy)
    model = _net(0)
    model, _ = loaded.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model.load_state_dict({k: v.to(p.dtype) for (k, v), p in zip(saved.state_dict().items(), model.state_dict().values())})

    control_model = _net(1)
    for p, q in zip(control_model.parameters(), model.parameters()):  # the control starts from what the load gave
        p.data = p.data.to(q.dtype).float()
    control = Engine(policy)
    control_model, _ = control.setup(control_model, torch.optim.SGD(control_model.parameters(), lr=0.1))
    _step(loaded, model)
    _step(control, control_model)
    for p, q in zip(model.parameters(), control_model.parameters()):
        assert torch.equal(p, q)


def test_loading_the_models_own_weights_keeps_the_masters_fp32_values() -> None:
    engine = Engine("bf16-true-masters")
    model = _net(0)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = {k: v.clone() for k, v in engine.masters.state_dict().items()}
    model.load_state_dict(model.state_dict())  # what a checkpoint of this very run holds
    assert all(torch.equal(before[k], v) for k, v in engine.masters.state_dict().items())


def test_a_copy_of_the_model_loads_without_touching_the_engines_masters() -> None:
    engine = Engine("bf16-true-masters")
    model = _net(0)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = {k: v.clone() for k, v in engine.masters.state_dict().items()}
    twin = copy.deepcopy(model)  # the tools copy models; the copy carries the hook
    twin.load_state_dict({k: torch.zeros_like(v) for k, v in twin.state_dict().items()})
    assert all(torch.equal(before[k], v) for k, v in engine.masters.state_dict().items())


def test_the_values_kept_for_masters_still_to_come_follow_a_load_too() -> None:
    engine = Engine("bf16-true-masters")
    model = engine.setup_module(_net(0))
    model.load_state_dict({k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()})
    engine.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    assert all(torch.equal(m, torch.full_like(m, 0.5)) for m in engine.masters.masters)


def test_a_set_up_model_still_pickles_whole(tmp_path) -> None:
    """torch.save(model) pickles its hooks: the loaded copy is a plain model that trains on its own."""
    engine = Engine("bf16-true-masters")
    model = _net(0)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    torch.save(model, tmp_path / "model.pt")
    again = torch.load(tmp_path / "model.pt", weights_only=False)
    again.load_state_dict(model.state_dict())
    assert torch.equal(again[0].weight, model[0].weight)
