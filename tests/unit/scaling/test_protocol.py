"""The scaler protocol: what the optimizer step needs of a loss scaler, met by ampkit's own scalers."""

from __future__ import annotations

import pytest
import torch

from ampkit.scaling import (
    DynamicLossScaler,
    LossScaler,
    ScalerConfig,
    StaticLossScaler,
    StepScaler,
)


@pytest.mark.parametrize("scaler", [DynamicLossScaler(), StaticLossScaler(8.0)], ids=["dynamic", "static"])
def test_ampkits_scalers_meet_the_protocol(scaler: LossScaler) -> None:
    assert isinstance(scaler, StepScaler)


@pytest.mark.parametrize("choice", ["raise", "warn"])
def test_on_collapse_says_what_the_config_asks(choice: str) -> None:
    assert DynamicLossScaler(ScalerConfig(on_collapse=choice)).on_collapse == choice  # type: ignore[arg-type]


def test_a_static_scale_has_no_collapse_to_warn_about_and_says_raise() -> None:
    scaler = StaticLossScaler(4.0)
    scaler.update(torch.ones(()))
    assert scaler.collapse_reason() is None and scaler.on_collapse == "raise"


def test_torchs_grad_scaler_is_not_a_step_scaler() -> None:
    # It unscales an optimizer (unscale_(optimizer)) and decides the skip in its own step(): the engine cannot use it.
    assert not isinstance(torch.amp.GradScaler("cpu"), StepScaler)
