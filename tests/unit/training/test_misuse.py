"""Loops that bypass the engine and used to train wrong in silence are refused, naming the line to write instead;
the legitimate loops beside each misuse train as before, compared with a control.

Each refusal is checked to leave no trace: the weights, the learning rate and the step count after the refused
call equal those of the same run without it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit._compat import optimizer_has_step_hooks


def mlp(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)


def batch(i: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g).to(device), torch.randint(0, 3, (4,), generator=g).to(device)


def run(precision: str, device: torch.device | str = "cpu", accumulate: int = 1) -> tuple[Engine, nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    engine = Engine(precision, accumulate=accumulate)
    model, opt = engine.setup(model, opt, schedulers=sched)
    return engine, model, opt, sched


def loss_of(engine: Engine, model: nn.Module, i: int, device: torch.device | str = "cpu") -> torch.Tensor:
    x, y = batch(i, device)
    with engine.autocast():
        return nn.functional.cross_entropy(model(x).float(), y)


def train(engine: Engine, model: nn.Module, micro_batches: range, device: torch.device | str = "cpu") -> None:
    for i in micro_batches:
        engine.backward(loss_of(engine, model, i, device))
        engine.step()


def weights(engine: Engine, model: nn.Module) -> list[torch.Tensor]:
    """The model's weights and, where the policy keeps them, the fp32 masters the optimizer steps."""
    masters = list(engine.masters.masters) if engine.masters is not None else []
    return [t.detach().clone() for t in [*model.parameters(), *masters]]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# ------------------------------------------------------------------------------------------ step without backward
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_step_without_backward_is_refused_and_the_schedule_stays(accumulate: int) -> None:
    """engine.step() for a window with no backward at all used to advance the StepLR (0.1 -> 0.0125 in three calls)
    while the optimizer updated nothing."""
    engine, model, opt, sched = run("32-true", accumulate=accumulate)
    train(engine, model, range(accumulate))  # one real step: lr 0.1 -> 0.05
    control = weights(engine, model), opt.param_groups[0]["lr"], sched.last_epoch, engine.steps
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r"engine\.backward\(loss\)"):
            for _ in range(accumulate):
                engine.step()
    assert (opt.param_groups[0]["lr"], sched.last_epoch, engine.steps) == control[1:] == (0.05, 1, 1)
    assert_same(weights(engine, model), control[0])
    assert engine.micro_batches_pending == accumulate - 1  # the refused call did not count its micro-batch


# ------------------------------------------------------------------------------------------ loss.backward() of one's own
def test_loss_backward_under_loss_scaling_is_refused(device: torch.device) -> None:
    """Under 16-mixed a loss.backward() of one's own leaves gradients that engine.step() then divides by the scale."""
    engine, model, opt, _ = run("16-mixed", device)
    control = weights(engine, model)
    loss_of(engine, model, 0, device).backward()
    with pytest.raises(RuntimeError, match=r"engine\.backward\(loss\)` in place of `loss\.backward\(\)"):
        engine.step()
    assert (opt.param_groups[0]["lr"], engine.steps) == (0.1, 0)
    assert_same(weights(engine, model), control)


def test_loss_backward_over_an_accumulation_window_is_refused() -> None:
    """With accumulate=3 a loss.backward() of one's own sums the window's gradients instead of averaging them."""
    engine, model, _, _ = run("32-true", accumulate=3)
    for i in range(3):
        loss_of(engine, model, i).backward()
        if i < 2:
            assert engine.step() is False
    with pytest.raises(RuntimeError, match="3 micro-batches"):
        engine.step()


def test_loss_backward_where_nothing_is_scaled_or_divided_trains_as_the_plain_loop() -> None:
    """32-true, one micro-batch per step: loss.backward() gives the gradients engine.backward() would, so it is not
    flagged; the run equals torch's plain loop bitwise."""
    engine, model, opt, _ = run("32-true")
    control = mlp()
    c_opt = torch.optim.SGD(control.parameters(), lr=0.1)
    c_sched = torch.optim.lr_scheduler.StepLR(c_opt, step_size=1, gamma=0.5)
    for i in range(3):
        loss_of(engine, model, i).backward()
        assert engine.step() is True
        x, y = batch(i)
        nn.functional.cross_entropy(control(x), y).backward()
        c_opt.step()
        c_sched.step()
        c_opt.zero_grad(set_to_none=True)
    assert_same(weights(engine, model), [p.detach() for p in control.parameters()])
    assert opt.param_groups[0]["lr"] == c_opt.param_groups[0]["lr"] == 0.0125


# ------------------------------------------------------------------------------------------ optimizer.step() of one's own
@pytest.mark.parametrize(
    ("precision", "accumulate", "why"),
    [("16-mixed", 1, "multiplied by the loss scale"), ("bf16-true-masters", 1, "fp32 masters"), ("32-true", 2, "divided by 2")],
)
def test_optimizer_step_after_engine_backward_is_refused(precision: str, accumulate: int, why: str, device: torch.device) -> None:
    """optimizer.step() of one's own after engine.backward(): under 16-mixed it stepped on scaled gradients (NaN
    weights), under a master-weight policy on masters without gradients (nothing), with accumulation on a part of
    the window. Refused before it changes anything: the run then equals the same run without the call."""
    engine, model, opt, _ = run(precision, device, accumulate)
    control_engine, control_model, _, _ = run(precision, device, accumulate)
    engine.backward(loss_of(engine, model, 0, device))
    with pytest.raises(RuntimeError, match=f"(?s){why}.*Write `engine.step\\(\\)` in place of `optimizer.step\\(\\)`"):
        opt.step()
    engine.step()
    train(engine, model, range(1, 2 * accumulate), device)
    train(control_engine, control_model, range(2 * accumulate), device)
    assert engine.steps == control_engine.steps == 2
    assert_same(weights(engine, model), weights(control_engine, control_model))


def test_optimizer_step_where_the_engine_has_nothing_to_do_trains_as_the_plain_loop() -> None:
    """32-true, one micro-batch per step, no clipping and no adopted scheduler: engine.backward() then
    optimizer.step() is torch's plain loop, so it is not flagged; a scheduler or clipping makes it refused."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine("32-true")
    model, opt = engine.setup(model, opt)
    control = mlp()
    c_opt = torch.optim.SGD(control.parameters(), lr=0.1)
    for i in range(3):
        engine.backward(loss_of(engine, model, i))
        opt.step()
        opt.zero_grad(set_to_none=True)
        x, y = batch(i)
        nn.functional.cross_entropy(control(x), y).backward()
        c_opt.step()
        c_opt.zero_grad(set_to_none=True)
    assert_same(weights(engine, model), [p.detach() for p in control.parameters()])
    clipped, model = Engine("32-true", clip_grad_norm=1.0), mlp()
    model, opt = clipped.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    clipped.backward(loss_of(clipped, model, 0))
    with pytest.raises(RuntimeError, match="not yet clipped to a total norm of 1.0"):
        opt.step()
    engine, model, opt, _ = run("32-true")
    engine.backward(loss_of(engine, model, 0))
    with pytest.raises(RuntimeError, match="LR scheduler"):
        opt.step()

def test_the_guard_leaves_the_fused_steps_on_and_other_step_hooks_count() -> None:
    """The engine's guard is a step pre-hook that its own compiled steps may bypass: it must not turn them off
    (they step unfused where an optimizer has hooks of its own), while a user's hook still counts."""
    _, _, opt, _ = run("bf16-true-masters")
    assert not optimizer_has_step_hooks(opt)
    handle = opt.register_step_pre_hook(lambda *args: None)
    assert optimizer_has_step_hooks(opt)
    handle.remove()


def test_a_checkpoint_load_counts_the_pending_window_as_backward(device: torch.device) -> None:
    """Loaded mid-window, the pending gradients are the engine's (scaled): optimizer.step() is refused, and
    engine.step() ends the window without a new backward. Loaded at a boundary, a step without backward is refused."""
    engine, model, _, _ = run("16-mixed", device, accumulate=2)
    engine.backward(loss_of(engine, model, 0, device))
    engine.step()
    mid_window = engine.state_dict()
    resumed, r_model, r_opt, _ = run("16-mixed", device, accumulate=2)
    resumed.load_state_dict(mid_window)
    with pytest.raises(RuntimeError, match="optimizer.step"):
        r_opt.step()
    assert resumed.step() is True
    train(engine, model, range(1, 2), device)  # the uninterrupted run ends the window with a backward of its own
    # The resumed window lacks micro-batch 1's gradient: compare it with a run that has only micro-batch 0's.
    control, c_model, _, _ = run("16-mixed", device, accumulate=2)
    control.backward(loss_of(control, c_model, 0, device))
    control.step()
    control.step()
    assert_same(weights(resumed, r_model), weights(control, c_model))
    at_boundary = engine.state_dict()
    again, _, _, _ = run("16-mixed", device, accumulate=2)
    again.load_state_dict(at_boundary)
    again.step()  # the first micro-batch of a window: nothing steps yet
    with pytest.raises(RuntimeError, match=r"engine\.backward\(loss\)"):
        again.step()
