"""LR schedulers moved other than by the engine: an adopted one stepped by hand too is refused (it decays twice per
step); one not adopted, stepped after every engine.step() on an optimizer whose step was skipped, is warned about
once, naming ``schedulers=``. Each with a twin where the correct loop stays silent."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from ampkit import Engine


def setup(precision: str = "32-true", *, adopt: bool) -> tuple[Engine, nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    engine = Engine(precision)
    model, opt = engine.setup(model, opt, schedulers=sched if adopt else None)
    return engine, model, opt, sched


def micro_batch(engine: Engine, model: nn.Module, bad: bool = False) -> bool:
    with engine.autocast():
        loss = model(torch.ones(2, 4)).float().sum()
    engine.backward(loss * float("inf") if bad else loss)
    return engine.step()


def test_an_adopted_scheduler_stepped_by_hand_is_refused_before_the_next_step() -> None:
    engine, model, _opt, sched = setup(adopt=True)
    micro_batch(engine, model)
    sched.step()  # torch's plain loop, on a scheduler the engine steps already
    weight = model.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"stepped outside engine.step\(\).*decays it twice per step.*Drop your scheduler.step\(\)"):
        micro_batch(engine, model)
    assert torch.equal(model.weight, weight)  # refused before the step changed anything


def test_an_adopted_scheduler_left_to_the_engine_decays_once_per_real_step_also_across_a_load(tmp_path: object) -> None:
    engine, model, opt, sched = setup(adopt=True)
    for _ in range(2):
        micro_batch(engine, model)
    assert opt.param_groups[0]["lr"] == 0.25
    path = f"{tmp_path}/c.pt"
    engine.save(path)
    micro_batch(engine, model)
    engine.load(path)  # the scheduler goes back to last_epoch 2: the load's doing, not a hand step
    micro_batch(engine, model)
    assert opt.param_groups[0]["lr"] == 0.125 and sched.last_epoch == 3


def test_a_scheduler_not_adopted_that_decays_on_a_skipped_step_is_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    engine, model, _opt, sched = setup("32-true", adopt=False)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for i in range(4):
            micro_batch(engine, model, bad=i in (1, 2))
            sched.step()  # after every engine.step(), skipped or not
    warned = [r.getMessage() for r in caplog.records if "schedulers=scheduler" in r.getMessage()]
    assert engine.skipped_steps == 2 and len(warned) == 1 and "between a skipped optimizer step and step 3" in warned[0]


def test_a_scheduler_not_adopted_stepped_only_on_real_steps_stays_silent(caplog: pytest.LogCaptureFixture) -> None:
    engine, model, opt, sched = setup("32-true", adopt=False)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        for i in range(4):
            micro_batch(engine, model, bad=i == 1)
            if not engine.step_was_skipped:
                sched.step()
    assert engine.skipped_steps == 1 and not [r for r in caplog.records if "schedulers=" in r.getMessage()]
    assert opt.param_groups[0]["lr"] == 0.5**3
