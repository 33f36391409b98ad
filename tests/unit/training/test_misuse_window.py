"""What the user's own code does to the accumulation window's gradients between engine.backward() and engine.step()
(a hand clip, a zero_grad, a backward of one's own, an optimizer setup() was not given), and what setup() is
given (a 16-bit model under a mixed policy, no optimizer): each misuse is refused naming the fix, before it changes
anything; the correct use beside it stays silent and trains as its control run.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.optim import optimizer as optim_module

from ampkit import Engine
from ampkit._compat import optimizer_has_step_hooks
from ampkit.training import _optimizer_step as optimizer_step


def mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dtype)


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)


def run(precision: str, accumulate: int = 1, **kwargs: object) -> tuple[Engine, nn.Module, torch.optim.Optimizer]:
    model = mlp()
    engine = Engine(precision, accumulate=accumulate, **kwargs)  # type: ignore[arg-type]
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return engine, model, opt


def loss_of(engine: Engine, model: nn.Module, i: int) -> torch.Tensor:
    x, y = batch(i)
    with engine.autocast():
        return nn.functional.cross_entropy(model(x).float(), y)


def train(engine: Engine, model: nn.Module, micro_batches: range) -> None:
    for i in micro_batches:
        engine.backward(loss_of(engine, model, i))
        engine.step()


def weights(engine: Engine, model: nn.Module) -> list[torch.Tensor]:
    masters = list(engine.masters.masters) if engine.masters is not None else []
    return [t.detach().clone() for t in [*model.parameters(), *masters]]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def next_call(engine: Engine, model: nn.Module, accumulate: int) -> None:
    """The engine's next call after the misuse: the step (a window of one), or the window's next backward."""
    if accumulate == 1:
        engine.step()
    else:
        engine.backward(loss_of(engine, model, 1))


def refused_leaves_no_trace(precision: str, accumulate: int, misuse: Callable[[Engine, nn.Module, torch.optim.Optimizer], None], match: str) -> None:
    """The misuse after the window's first backward (``misuse`` ends with :func:`next_call`) is refused; the run that
    goes on, its gradients put back by hand where the misuse changed them, equals the same run without it: weights,
    step count and window position."""
    engine, model, opt = run(precision, accumulate)
    control, c_model, _ = run(precision, accumulate)
    engine.backward(loss_of(engine, model, 0))
    if accumulate > 1:
        assert engine.step() is False
    saved = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    with pytest.raises(RuntimeError, match=match):
        misuse(engine, model, opt)
    assert engine.steps == 0 and engine.micro_batches_pending == accumulate - 1
    for p, g in zip(model.parameters(), saved):
        p.grad = g  # what the misuse itself did to the gradients, undone
    engine._watch.forget()  # and the watch told so (a test's shortcut: a run would start over)
    engine._watch.record()
    if accumulate > 1:
        engine.backward(loss_of(engine, model, 1))
    assert engine.step() is True
    train(engine, model, range(accumulate, 2 * accumulate))
    train(control, c_model, range(2 * accumulate))
    assert engine.steps == control.steps == 2
    assert_same(weights(engine, model), weights(control, c_model))


# ------------------------------------------------------------------------------------------ an optimizer not given to setup
@pytest.mark.parametrize(("precision", "why"), [("16-mixed", "multiplied by the loss scale"), ("bf16-true-masters", "copies the masters back")])
def test_an_optimizer_setup_was_not_given_is_refused_on_the_models_parameters(precision: str, why: str) -> None:
    """Before: under 16-mixed it stepped the scaled gradients (weights moved by ~1.7e3); under bf16-true-masters it
    moved the bf16 model, and the next engine.step() copied the unmoved masters back over it."""
    def foreign_step(engine: Engine, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        torch.optim.SGD(model.parameters(), lr=0.1).step()

    refused_leaves_no_trace(precision, 1, foreign_step, f"(?s)SGD.step\\(\\) of an optimizer engine.setup\\(\\) was not given.*{why}.*engine.setup\\(model, opt_a, opt_b\\)")


def test_another_models_optimizer_steps_freely_and_the_guards_leave_the_fused_step_on() -> None:
    engine, model, opt = run("16-mixed")
    other = nn.Linear(2, 1)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    before = other.weight.detach().clone()
    engine.backward(loss_of(engine, model, 0))
    other(torch.ones(1, 2)).sum().backward()
    other_opt.step()  # gradients of the engine's pending, but none of them this optimizer's
    assert not torch.equal(other.weight, before)
    assert engine.step() and not optimizer_has_step_hooks(opt)  # the global guard is marked bypassable too
    held = torch.optim.SGD(model.parameters(), lr=0.1)
    held.step()  # nothing of the engine's pending after its step: silent
    hooks = [h for h in optim_module._global_optimizer_pre_hooks.values() if type(h).__name__ == "ForeignStepGuard"]
    assert len(hooks) == 1  # one for the process, however many engines were set up
    ref = next(r for r, _ in hooks[0]._watched if r() is engine)
    del engine, opt
    gc.collect()
    assert ref() is None  # held weakly: a finished run is let go


# ------------------------------------------------------------------------------------------ gradients changed in place
@pytest.mark.parametrize(("precision", "accumulate", "what"), [("16-mixed", 1, "multiplied by the loss scale"), ("32-true", 2, "partial sums of a window of 2")])
def test_a_hand_clip_between_backward_and_step_is_refused(precision: str, accumulate: int, what: str) -> None:
    """Before: trained on without a word (16-mixed: clipped the scaled gradients; accumulate=2: clipped each partial
    sum). Refused at the next engine call, naming Engine(clip_grad_norm=...)."""
    def clip(engine: Engine, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        next_call(engine, model, accumulate)

    refused_leaves_no_trace(precision, accumulate, clip, f"(?s)changed in place.*{what}.*Engine\\(clip_grad_norm=...\\).*engine.unscale_\\(\\)")


def test_a_hand_clip_after_unscale_is_the_engines_clip() -> None:
    """The documented hand clip, engine.unscale_() then clip_grad_norm_, stays silent and equals clip_grad_norm=1.0."""
    engine, model, _ = run("16-mixed", accumulate=2)
    control, c_model, _ = run("16-mixed", accumulate=2, clip_grad_norm=1.0)
    for i in range(4):
        engine.backward(loss_of(engine, model, i))
        if engine.is_boundary:
            engine.unscale_()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        engine.step()
    train(control, c_model, range(4))
    assert engine.steps == control.steps == 2
    for a, b in zip(weights(engine, model), weights(control, c_model)):
        torch.testing.assert_close(a, b)


def test_a_hand_clip_where_nothing_is_scaled_or_divided_is_the_engines_clip() -> None:
    """32-true, one micro-batch per step: the gradients between the two calls are the true ones, whole; a hand clip
    there is torch's plain loop, silent, and equals clip_grad_norm=1.0."""
    engine, model, _ = run("32-true")
    control, c_model, _ = run("32-true", clip_grad_norm=1.0)
    for i in range(2):
        engine.backward(loss_of(engine, model, i))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        engine.step()
    train(control, c_model, range(2))
    for a, b in zip(weights(engine, model), weights(control, c_model)):
        torch.testing.assert_close(a, b)


def test_a_gradient_hook_of_the_users_own_stays_silent() -> None:
    """A hook changes the gradient inside engine.backward(): the engine's gradients are the hooked ones."""
    engine, model, _ = run("16-mixed", accumulate=2)
    control, c_model, _ = run("16-mixed", accumulate=2)
    for p in model.parameters():
        p.register_hook(lambda g: g * 0.5)
    train(engine, model, range(2))
    control.backward(loss_of(control, c_model, 0) * 0.5)
    control.step()
    control.backward(loss_of(control, c_model, 1) * 0.5)
    control.step()
    assert_same(weights(engine, model), weights(control, c_model))


def test_an_inf_planted_in_one_layer_stays_silent_and_the_step_is_skipped() -> None:
    """Editing one layer's gradient is not a whole-model clip: the watch lets it pass (tests plant infs so)."""
    engine, model, _ = run("16-mixed")
    before = weights(engine, model)
    engine.backward(loss_of(engine, model, 0))
    model[0].weight.grad[0, 0] = float("inf")
    assert engine.step() and engine.step_was_skipped
    assert_same(weights(engine, model), before)


def test_a_gradient_penalty_and_a_layer_without_gradient_stay_silent_and_a_clip_is_still_found() -> None:
    """engine.grad() (a double backward that accumulates nothing) stays silent; the sentinels are parameters that got
    a gradient, so an unused first layer does not blind the watch to a hand clip."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"unused": nn.Linear(8, 8), "net": nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))})
    engine = Engine("16-mixed", accumulate=2)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for i in range(2):
        x, y = batch(i)
        x.requires_grad_(True)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model["net"](x).float(), y)
        (gx,) = engine.grad(loss, [x])
        engine.backward(loss + gx.pow(2).sum())
        engine.step()
    assert engine.steps == 1 and model["unused"].weight.grad is None
    x, y = batch(2)
    with engine.autocast():
        engine.backward(nn.functional.cross_entropy(model["net"](x).float(), y))
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    engine.step()
    with pytest.raises(RuntimeError, match="changed in place"):
        engine.backward(loss_of(engine, model["net"], 3))


# ------------------------------------------------------------------------------------------ a backward of one's own
@pytest.mark.parametrize(("precision", "accumulate", "why"), [("16-mixed", 1, "loss scale"), ("32-true", 2, "window's 2 micro-batches")])
def test_a_backward_outside_the_engine_beside_its_own_is_refused(precision: str, accumulate: int, why: str) -> None:
    """engine.backward(l1) then l2.backward(): before, trained on with l2's gradient unscaled / undivided."""
    def other_backward(engine: Engine, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        loss_of(engine, model, 7).backward()
        next_call(engine, model, accumulate)

    refused_leaves_no_trace(precision, accumulate, other_backward, f"(?s)a backward outside engine.backward\\(\\).*{why}.*engine.backward\\(loss_a \\+ loss_b\\)")


def test_several_losses_through_the_engine_equal_their_sum() -> None:
    engine, model, _ = run("16-mixed", accumulate=2)
    control, c_model, _ = run("16-mixed", accumulate=2)
    for i in range(2):
        engine.backward(loss_of(engine, model, i))
        engine.backward(loss_of(engine, model, i + 10))
        engine.step()
        control.backward(loss_of(control, c_model, i) + loss_of(control, c_model, i + 10))
        control.step()
    for a, b in zip(weights(engine, model), weights(control, c_model)):
        torch.testing.assert_close(a, b)


def test_a_backward_of_ones_own_where_nothing_is_scaled_or_divided_stays_silent() -> None:
    """32-true, one micro-batch per step: engine.backward(l1) + l2.backward() gives engine.backward(l1 + l2)'s gradients."""
    engine, model, _ = run("32-true")
    control, c_model, _ = run("32-true")
    for i in range(2):
        engine.backward(loss_of(engine, model, i))
        loss_of(engine, model, i + 10).backward()
        engine.step()
        control.backward(loss_of(control, c_model, i) + loss_of(control, c_model, i + 10))
        control.step()
    for a, b in zip(weights(engine, model), weights(control, c_model)):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------ zero_grad mid-window
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_inside_an_accumulation_window_is_refused(set_to_none: bool) -> None:
    """Before: the window's first micro-batch was dropped and the step took half of the second's gradient."""
    def zero(engine: Engine, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=set_to_none)
        next_call(engine, model, 2)

    match = "zeroed \\(set to None\\).*Drop optimizer.zero_grad" if set_to_none else "changed in place.*zero_grad\\(set_to_none=False\\) erases them"
    refused_leaves_no_trace("32-true", 2, zero, f"(?s){match}")


def test_zero_grad_at_the_windows_end_stays_silent() -> None:
    engine, model, opt = run("32-true", accumulate=2)
    control, c_model, _ = run("32-true", accumulate=2)
    for i in range(4):
        engine.backward(loss_of(engine, model, i))
        if engine.step():
            opt.zero_grad()  # the old habit, at the boundary: nothing pending to lose
    train(control, c_model, range(4))
    assert_same(weights(engine, model), weights(control, c_model))


def test_train_step_and_a_load_mid_window_stay_silent() -> None:
    """Engine code that sets the gradients itself (a checkpoint's pending window, train_step) is not the user's misuse."""
    engine, model, _ = run("16-mixed", accumulate=2)
    engine.train_step(lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1]), batch(0))
    state = engine.state_dict()
    resumed, r_model, _ = run("16-mixed", accumulate=2)
    r_model.load_state_dict(model.state_dict())
    resumed.load_state_dict(state)
    resumed.backward(loss_of(resumed, r_model, 1))
    assert resumed.step() and resumed.steps == 1


# ------------------------------------------------------------------------------------------ what setup() is given
@pytest.mark.parametrize(("precision", "dtype", "fix"), [("16-mixed", torch.float16, "16-true-masters"), ("bf16-mixed", torch.bfloat16, "bf16-true-masters")])
def test_a_16_bit_model_under_a_mixed_policy_is_refused(precision: str, dtype: torch.dtype, fix: str) -> None:
    """Before: trained the 16-bit weights with no fp32 copy, updates rounding away."""
    match = f"(?s)steps 4 {dtype} parameter.*keeps fp32 weights.*drop model.half\\(\\).*Engine\\('{fix}'\\)"
    model = mlp(dtype)
    with pytest.raises(ValueError, match=match):
        Engine(precision).setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine = Engine(precision)
    model = engine.setup_module(mlp(dtype))
    with pytest.raises(ValueError, match=match):
        engine.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_frozen_16_bit_base_with_fp32_adapters_stays_silent(caplog: pytest.LogCaptureFixture) -> None:
    """LoRA's shape: the base frozen in bf16, the trained head in fp32 under bf16-mixed."""
    base, head = nn.Linear(8, 16).to(torch.bfloat16).requires_grad_(False), nn.Linear(16, 3)
    model = nn.Sequential(base, head)
    engine = Engine("bf16-mixed")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        model, _ = engine.setup(model, torch.optim.SGD(head.parameters(), lr=0.1))
        before = head.weight.detach().clone()
        engine.backward(loss_of(engine, model, 0))
        assert engine.step()
    assert not torch.equal(head.weight, before) and not caplog.records


def test_a_step_after_setup_without_an_optimizer_is_refused_and_backward_alone_stays() -> None:
    """Before: engine.step() returned True and counted a step that updated nothing. engine.backward() alone, to read
    gradients (the doctor's use), gives the plain backward's gradients."""
    engine, model = Engine("32-true"), mlp()
    control = mlp()
    model = engine.setup(model)
    engine.backward(loss_of(engine, model, 0))
    x, y = batch(0)
    nn.functional.cross_entropy(control(x), y).backward()
    assert_same([p.grad for p in model.parameters()], [p.grad for p in control.parameters()])  # type: ignore[misc]
    with pytest.raises(RuntimeError, match=r"setup\(model\) with no optimizer.*engine.setup\(model, optimizer\)"):
        engine.step()
    assert engine.steps == 0


# ------------------------------------------------------------------------------------------ the cost
def test_the_window_checks_make_no_host_device_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused optimizer under 16-mixed with accumulation: the watch reads attributes, never a device value."""
    model = mlp()
    engine = Engine("16-mixed", accumulate=2)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
    train(engine, model, range(2))  # the first step builds the optimizer's state
    reads: list[str] = []
    for i in range(2, 6):
        with monkeypatch.context() as patch:
            patch.setattr(optimizer_step, "reads_are_free", lambda device: False)
            for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
                original = getattr(torch.Tensor, name)
                patch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original: reads.append(_n) or _o(self, *a))
            train(engine, model, range(i, i + 1))
        # Read outside the checked block, as test_engine's sync tests do: the next step would otherwise read this
        # step's flag from its host slot, a wait on an accelerator only if the loop ran that far ahead.
        assert not engine.step_was_skipped
    assert not reads and engine.steps == 3
