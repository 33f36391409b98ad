"""What Engine's arguments name: a scaler is anything with the step's scaler protocol; torch's GradScaler is refused
with the ScalerConfig that scales as it does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ampkit import Engine, ScalerConfig
from ampkit.scaling import DynamicLossScaler, StaticLossScaler, StepScaler


class CountingScaler:
    """A scaler of the user's own, no subclass of ampkit's: a static scale that counts its updates."""

    def __init__(self, scale: float) -> None:
        self.inner = StaticLossScaler(scale)
        self.updates = 0

    scale_tensor = property(lambda self: self.inner.scale_tensor)
    on_collapse = property(lambda self: "raise")

    def to(self, device: torch.device | str) -> CountingScaler:
        self.inner.to(device)
        return self

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.inner.scale(loss)

    def inv_scale(self) -> torch.Tensor:
        return self.inner.inv_scale()

    def unscale_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        return self.inner.unscale_(grads, found_inf)

    def check_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        return self.inner.check_(grads, found_inf)

    def update(self, found_inf: torch.Tensor) -> None:
        self.updates += 1

    def get_scale(self) -> float:
        return self.inner.get_scale()

    def collapse_reason(self) -> str | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        self.updates = state["updates"]


def _train(scaler: Any) -> tuple[Engine, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    engine = Engine("bf16-mixed", scaler=scaler, clip_grad_norm=1.0)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    g = torch.Generator().manual_seed(1)
    for i in range(3):
        with engine.autocast():
            loss = model(torch.randn(5, 4, generator=g)).float().pow(2).mean()
        engine.backward(loss)
        if i == 1:
            model[0].weight.grad[0, 0] = float("inf")
        engine.step()
    return engine, [p.detach().clone() for p in model.parameters()]


def test_a_scaler_of_the_users_own_is_used_as_ampkits_own_would_be() -> None:
    scaler = CountingScaler(64.0)
    assert isinstance(scaler, StepScaler)
    engine, weights = _train(scaler)
    control, control_weights = _train(64.0)  # ampkit's StaticLossScaler, the same scale
    assert engine.scaler is scaler and scaler.updates == 3
    assert engine.skipped_steps == control.skipped_steps == 1
    for a, b in zip(weights, control_weights):
        assert torch.equal(a, b)
    assert engine.state_dict()["scaler"]["updates"] == 3


class InPlaceScaler(CountingScaler):
    """The same scaler, moved in place: its ``to()`` returns None, as in-place methods often do."""

    def to(self, device: torch.device | str) -> None:  # type: ignore[override]
        self.inner.to(device)


def test_a_scaler_whose_to_returns_nothing_is_still_the_one_that_scales() -> None:
    # The engine once kept what to() returned as its scaler: None here, and the run went on unscaled, unskipped.
    scaler = InPlaceScaler(64.0)
    engine, weights = _train(scaler)
    control, control_weights = _train(64.0)
    assert engine.scaler is scaler and scaler.updates == 3
    assert engine.skipped_steps == control.skipped_steps == 1
    for a, b in zip(weights, control_weights):
        assert torch.equal(a, b)


def test_torchs_grad_scaler_is_refused_with_the_scaler_config_that_scales_as_it_does() -> None:
    gs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=10)
    with pytest.raises(ValueError, match=r"pass scaler=ampkit\.ScalerConfig\(init_scale=1024, growth_factor=3, backoff_factor=0\.25, growth_interval=10\)") as refused:
        Engine("16-mixed", scaler=gs)
    config = eval(str(refused.value).split("scaler=ampkit.")[1].split(", its rules")[0], {"ScalerConfig": ScalerConfig})  # the line, as written
    ours, theirs = DynamicLossScaler(config), torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=10)
    for found in [0.0] * 10 + [1.0, 0.0, 1.0] + [0.0] * 12:  # GradScaler's own rules, step for step
        ours.update(torch.tensor(found))
        _update(theirs, found)
        assert ours.get_scale() == theirs.get_scale()


def _update(scaler: torch.amp.GradScaler, found: float) -> None:
    # GradScaler updates from the flags its unscale_ recorded: record one for a stand-in optimizer.
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.full((1,), float("inf") if found else 0.0)
    opt = torch.optim.SGD([p], lr=0.0)
    scaler.scale(torch.zeros((), requires_grad=True))
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()


def test_a_disabled_grad_scaler_is_refused_for_scaler_none() -> None:
    with pytest.raises(ValueError, match=r"scales nothing: pass scaler='none'"):
        Engine("bf16-mixed", scaler=torch.amp.GradScaler("cpu", enabled=False))


# ------------------------------------------------------------------------------------------ issue 50: weaker messages
def _engine_and_model() -> tuple[Engine, nn.Module]:
    model = nn.Linear(4, 2)
    engine = Engine()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return engine, model


@pytest.mark.parametrize(("make", "match"), [
    (lambda m: m(torch.ones(3, 4)), r"takes the scalar loss, got a tensor of shape \(3, 2\).*loss.mean\(\)"),
    (lambda m: m(torch.ones(3, 4)).sum().detach(), r"does not require grad.*detached"),
])
def test_a_loss_engine_backward_cannot_train_on_is_named(make: object, match: str) -> None:
    engine, model = _engine_and_model()
    with pytest.raises(ValueError, match=match):
        engine.backward(make(model))  # type: ignore[operator]


def test_a_loss_computed_under_no_grad_is_named_and_a_right_loss_passes() -> None:
    engine, model = _engine_and_model()
    with torch.no_grad(), pytest.raises(ValueError, match=r"inside torch.no_grad\(\)"):
        engine.backward(model(torch.ones(3, 4)).sum())
    with torch.inference_mode():
        out = model(torch.ones(3, 4)).sum()
    with pytest.raises(ValueError, match="inference_mode"):
        engine.backward(out)
    engine.backward(model(torch.ones(3, 4)).sum())  # the twins: a scalar loss, and a non-scalar one with its gradient
    engine.backward(model(torch.ones(3, 4)), gradient=torch.ones(3, 2))
    assert engine.step()


def test_a_scheduler_passed_positionally_names_schedulers_and_by_name_is_adopted() -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(TypeError, match=r"schedulers=scheduler"):
        Engine().setup(model, opt, sched)
    engine = Engine()
    engine.setup(model, opt, schedulers=sched)
    assert engine.schedulers == [sched]


@pytest.mark.parametrize("arg", ["clip_grad_norm", "clip_grad_value"])
def test_a_bool_clip_is_refused_and_a_number_taken(arg: str) -> None:
    with pytest.raises(ValueError, match=rf"{arg}=True is not a number.*{arg}=1.0"):
        Engine(**{arg: True})  # type: ignore[arg-type]
    assert getattr(Engine(**{arg: 1}), arg) == 1  # type: ignore[arg-type]
