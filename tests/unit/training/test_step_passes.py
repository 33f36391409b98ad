"""A non-finite loss or gradient never reaches the weights, under every policy: the step is skipped and counted, a
WARNING names it (none under a loss scaler, whose overflows are its work), ``skip_nonfinite='raise'`` stops there, and
``skip_nonfinite=False`` opts out. Each run is checked against a control run that never met the bad batch."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from ampkit import Engine

NAN_AT = 2  # the micro-batch whose loss is NaN (0-based): optimizer step 3


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)


def train(precision: str, batches: list[int], *, nan_at: int | None = None, opt: str = "adamw", **kwargs: object) -> tuple[Engine, nn.Module]:
    model = mlp()
    optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-2, fused=opt == "fused") if opt != "sgd-momentum"
                 else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True))
    engine = Engine(precision, **kwargs)  # type: ignore[arg-type]
    model, _ = engine.setup(model, optimizer)
    for i in batches:
        x, y = batch(i)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss * float("nan") if i == nan_at else loss)
        engine.step()
    return engine, model


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().float() for p in model.parameters()]


@pytest.mark.parametrize(("precision", "opt", "clip"), [
    ("bf16-mixed", "adamw", None), ("32-true", "fused", None), ("32-true", "adamw", 1.0), ("bf16-true", "adamw", None),
    ("bf16-true-masters", "adamw", None), ("32-true", "sgd-momentum", None),
])
def test_a_nan_loss_is_skipped_and_named_under_every_policy(precision: str, opt: str, clip: float | None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        engine, model = train(precision, [0, 1, 2, 3], nan_at=NAN_AT, opt=opt, clip_grad_norm=clip)
    control, control_model = train(precision, [0, 1, 3], opt=opt, clip_grad_norm=clip)
    for p, q in zip(params(model), params(control_model)):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # the skipped step changed nothing: weights nor optimizer state
    assert engine.skipped_steps == 1 and engine.steps == 4 and control.skipped_steps == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "skipped" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"Optimizer step {NAN_AT + 1} skipped") and precision in warned[0]


def test_a_clean_run_and_a_scalers_overflow_stay_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        clean, _ = train("bf16-mixed", [0, 1, 2])
        scaled, _ = train("16-mixed", [0, 1, 2, 3], nan_at=NAN_AT)  # an overflow: the scaler backs off, as it should
    assert clean.skipped_steps == 0 and scaled.skipped_steps == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_raise_stops_at_the_step_with_the_weights_untouched() -> None:
    with pytest.raises(FloatingPointError, match=rf"Optimizer step {NAN_AT + 1} skipped.*skip_nonfinite='raise'\) stops here"):
        train("bf16-mixed", [0, 1, 2, 3], nan_at=NAN_AT, skip_nonfinite="raise")
    engine, model = train("bf16-mixed", [0, 1], skip_nonfinite="raise")  # the twin: a clean run goes on
    assert engine.steps == 2 and all(torch.isfinite(p).all() for p in params(model))


def test_the_opt_out_lets_the_nan_through_as_torch_would(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        engine, model = train("32-true", [0, 1, 2], nan_at=NAN_AT, skip_nonfinite=False)
    assert not engine.skip_nonfinite and engine.skipped_steps == 0
    assert not all(torch.isfinite(p).all() for p in params(model)) and not caplog.records


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"precision": "16-mixed", "skip_nonfinite": "raise"}, "stop the run at its first overflow"),
    ({"skip_nonfinite": "yes"}, "skip_nonfinite='yes' is not understood"),
])
def test_raise_with_a_scaler_and_unknown_values_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Engine(**kwargs)  # type: ignore[arg-type]


def test_a_run_that_skips_every_step_warns_at_the_first_three_then_at_powers_of_two(caplog: pytest.LogCaptureFixture) -> None:
    model = mlp()
    engine = Engine("32-true")
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for i in range(17):
            x, y = batch(i)
            engine.backward(nn.functional.cross_entropy(model(x), y) * float("nan"))
            engine.step()
    named = [int(r.getMessage().split()[2].rstrip(":")) for r in caplog.records if r.getMessage().startswith("Optimizer step")]
    assert engine.skipped_steps == 17 and named == [1, 2, 3, 4, 8, 16]
