"""The optimizer step's cost, counted: the Engine's step against torch's hand-written loop on the same model, data,
fused AdamW and clipping, in aten ops dispatched and host syncs per step.

Counts are deterministic, so they are asserted here (timings are the benchmarks' business: see
benchmarks/engine_overhead.py). On the CPU the engine runs its accelerator path (the overflow flag is sent to the
host, not read), so the counts are those of a GPU step; a GPU pass (``--device cuda``) counts them there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.policy._masters import MasterWeights
from ampkit.profile._op_count import StepCounts, count_step
from ampkit.scaling import DynamicLossScaler, ScalerConfig, StaticLossScaler
from ampkit.training import _optimizer_step as optimizer_step
from ampkit.training._optimizer_step import OptimizerStep, StepSettings
from ampkit.training._step_state import StepState

# What the engine's 16-mixed step dispatches beyond GradScaler's loop, for what that loop does not do: the clamp of
# the scale to its floor and ceiling (1), the collapse counters, skips in a row and the floor check (4: the flag,
# the floor test, the count, one multiply that keeps or clears both), and the flag's copy to the host (1). Less
# the three GradScaler dispatches that the engine does without (two copies of its scale and flag to the
# gradients' device, the sum of the per-device flags).
ALLOWANCE_16_MIXED = 6 - 3
# Without loss scaling the engine still skips a step whose gradients are not finite, which the hand loop does not:
# the flag (1), the check of the clipping's total norm, inf/NaN exactly when a gradient is (2: a one to multiply by
# and the check), fused AdamW's own undoing of its step count on a skipped step (1), the flag's copy to the host (1).
ALLOWANCE_UNSCALED = 5

Step = Callable[[torch.Tensor, torch.Tensor], None]
INF = float("inf")


def mlp(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)).to(device)


def hand_written(precision: str, device: torch.device) -> Step:
    """torch's documented loop: autocast, GradScaler for fp16 (unscale_ before clipping), fused AdamW."""
    model = mlp(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def engine_loop(precision: str, device: torch.device) -> tuple[Step, Engine]:
    engine = Engine(precision, clip_grad_norm=1.0)
    model = mlp(device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()

    return step, engine


def counts(precision: str, device: torch.device) -> tuple[StepCounts, StepCounts, Engine]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
    step, engine = engine_loop(precision, device)
    # Two warm-up steps: the first builds the optimizer's state, the second is the first with an earlier outcome.
    return count_step(hand_written(precision, device), x, y, warmup=2), count_step(step, x, y, warmup=2), engine


def excess(a: StepCounts, b: StepCounts) -> str:
    return f"{a.ops} ops against {b.ops}; more: {dict(a - b)}; fewer: {dict(b - a)}"


def test_the_16_mixed_step_dispatches_at_most_the_allowance_more_than_gradscalers_loop_and_no_sync(device: torch.device) -> None:
    hand, engine, run = counts("16-mixed", device)
    assert engine.ops <= hand.ops + ALLOWANCE_16_MIXED, excess(engine, hand)
    assert engine.syncs == hand.syncs == 0
    assert run.steps == 3 and not run.step_was_skipped  # the counted step was a real one


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_without_loss_scaling_the_step_dispatches_what_the_hand_loop_does_and_the_nonfinite_check(precision: str, device: torch.device) -> None:
    if precision == "bf16-mixed" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("Requires: [CUDA bf16]")
    hand, engine, _ = counts(precision, device)
    assert engine.ops <= hand.ops + ALLOWANCE_UNSCALED, excess(engine, hand)
    assert engine.syncs == hand.syncs == 0


def test_the_flag_copy_is_the_one_op_that_tells_the_host_the_outcome(device: torch.device) -> None:
    # The copy into the host slot is counted among the allowance; reading it later dispatches nothing and waits
    # for nothing once it has landed (on the CPU at once).
    step, engine = engine_loop("16-mixed", device)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
    got = count_step(step, x, y, warmup=2)
    assert got.by_op["aten.copy_.default"] == 1 and got.by_op["aten._local_scalar_dense.default"] == 0
    assert not engine.step_was_skipped and engine.skipped_steps == 0


# ------------------------------------------------------------------------------------------ the component on its own
# OptimizerStep without an Engine: each test holds it to plain torch on the same weights and gradients.


def _model_and_grads(seed: int = 0) -> tuple[nn.Module, list[torch.Tensor]]:
    model = mlp(torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    return model, grads


def _give(model: nn.Module, grads: list[torch.Tensor], factor: float = 1.0) -> None:
    for p, grad in zip(model.parameters(), grads):
        p.grad = grad * factor

def test_the_component_unscales_clips_and_steps_as_torchs_own_calls_do() -> None:

    control, grads = _model_and_grads()
    treat, _ = _model_and_grads()
    c_opt = torch.optim.AdamW(control.parameters(), lr=1e-2)
    t_opt = torch.optim.AdamW(treat.parameters(), lr=1e-2)
    step = OptimizerStep([t_opt], settings=StepSettings(clip_grad_norm=0.5, skip_nonfinite=True), scaler=StaticLossScaler(8.0))
    for _ in range(3):
        _give(control, grads)
        norm = torch.nn.utils.clip_grad_norm_(control.parameters(), 0.5)
        c_opt.step()
        c_opt.zero_grad(set_to_none=True)
        _give(treat, grads, factor=8.0)  # as a backward of the scaled loss leaves them
        outcome = step.step([t_opt])
        assert outcome.skipped is False and not outcome.fused and torch.equal(outcome.norm, norm)
        assert all(p.grad is None for p in treat.parameters())  # the step zeroes what it took
    for a, b in zip(treat.parameters(), control.parameters()):
        assert torch.equal(a, b)


def test_an_overflow_skips_the_step_backs_the_scale_off_and_holds_the_schedule() -> None:

    model, grads = _model_and_grads()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    step = OptimizerStep([opt], [sched], settings=StepSettings(skip_nonfinite=True), scaler=DynamicLossScaler(ScalerConfig(init_scale=4.0)))
    _give(model, grads)
    next(model.parameters()).grad[0, 0] = INF
    outcome = step.step([opt])
    assert outcome.skipped is True and float(outcome.found) > 0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert step.scaler.get_scale() == 2.0 and sched.get_last_lr() == [0.1]
    assert step.state_dict()["skipped_steps"] == 1


def test_without_a_host_read_the_outcome_is_left_to_come_and_comes() -> None:
    # A fused optimizer on an accelerator: the flag goes to the host without a sync, and is read later.

    model, grads = _model_and_grads()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    state = StepState()
    step = OptimizerStep([opt], settings=StepSettings(skip_nonfinite=True), scaler=DynamicLossScaler(), state=state)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optimizer_step, "reads_are_free", lambda device: False)
        _give(model, grads)
        outcome = step.step([opt])
    assert outcome.skipped is None and state.deferred is not None
    step.resolve()
    assert state.found_host is False and state.deferred is None


def test_the_components_state_round_trips_through_its_own_state_dict() -> None:

    def build() -> tuple[nn.Module, OptimizerStep]:
        model, _ = _model_and_grads()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        masters = MasterWeights.clone(list(model.named_parameters()), [opt])
        model.half()
        return model, OptimizerStep([opt], settings=StepSettings(skip_nonfinite=True), scaler=DynamicLossScaler(ScalerConfig(init_scale=2.0**10)), masters=masters)

    model, step = build()
    _, grads = _model_and_grads(seed=3)
    _give(model, [g.half() for g in grads])
    step.step(step.optimizers)
    saved = step.state_dict()
    _, other = build()
    other.load_state_dict(saved)
    again = other.state_dict()
    assert again["scaler"] == saved["scaler"] and sorted(again["masters"]) == sorted(saved["masters"])
    assert all(torch.equal(again["masters"][k], v) for k, v in saved["masters"].items())


def test_a_scaler_without_skipping_is_refused() -> None:

    with pytest.raises(ValueError, match="skip"):
        OptimizerStep(settings=StepSettings(skip_nonfinite=False), scaler=StaticLossScaler(2.0))


def test_an_optimizer_the_step_was_not_built_with_is_refused_by_name() -> None:

    model, _ = _model_and_grads()
    step = OptimizerStep([torch.optim.SGD(model.parameters(), lr=0.1)])
    with pytest.raises(ValueError, match=r"\['Adam'\] were not passed to engine.setup"):
        step.stepping([torch.optim.Adam(model.parameters())])
