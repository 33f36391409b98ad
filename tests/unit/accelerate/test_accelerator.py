"""``AmpkitAccelerator`` inside an unchanged Accelerate loop, measured against two controls on the same weights and
batches: Accelerate's own ``Accelerator(mixed_precision="bf16")`` (and its fp32 run), and the plain ``ampkit.Engine``
loop, which every policy must match bit for bit (losses, weights, loss scale, skipped steps, the clipped norm)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn

import ampkit
from ampkit.accelerate import AmpkitAccelerator, AmpkitOptimizer
from ampkit.policy import get_policy

INF = float("inf")
POLICIES = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "bf16-true-masters", "bf16-true-remainder", "16-true-masters",
            "bf16-true-kahan", "bf16-true-sr"]
STEPS = 12  # optimizer steps
ACCUMULATE = 2  # micro-batches per step
CLIP = 0.5
Batch = tuple[torch.Tensor, torch.Tensor]


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 3))


def _batches(n: int = STEPS * ACCUMULATE) -> list[Batch]:
    """A learnable task: labels from a fixed random teacher, so every policy's loss must fall."""
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(8, 3, generator=g)
    xs = [torch.randn(16, 8, generator=g) for _ in range(n)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


def _opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=2e-2, weight_decay=0.01)


def _schedule(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (2 * STEPS))


def _available(policy: str) -> None:
    support = get_policy(policy).support("cpu")
    if not support.supported:
        pytest.skip(f"{policy}: {support.reason}")


def fresh(make: Callable[[], Accelerator]) -> Accelerator:
    """``make()`` after Accelerate's process state is reset: a native and an ampkit run may follow each other."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return make()


def _converts(policy: str) -> bool:
    return policy in ("bf16-true-kahan", "bf16-true-sr")  # their optimizers become library twins at prepare


def accelerate_loop(accelerator: Accelerator, batches: list[Batch], poison: set[int] = frozenset(), clip: float | None = CLIP,
                    log: Callable[[int, nn.Module, Any], None] | None = None) -> dict[str, Any]:
    """The Accelerate loop of docs/guides/frameworks.md, unchanged between the native and the ampkit accelerator. An inf lands in one
    gradient at the window's end of the optimizer steps in ``poison``; ``log(step, model, scheduler)`` after each step."""
    model, opt = _net(), None
    opt = _opt(model.parameters())
    if isinstance(accelerator, AmpkitAccelerator) and _converts(accelerator.precision):
        model, opt = accelerator.prepare(model, opt)  # the twin's scheduler is built on what prepare returns
        scheduler = accelerator.prepare(_schedule(opt))
    else:
        model, opt, scheduler = accelerator.prepare(model, opt, _schedule(opt))
    losses, norms, skipped = [], [], []
    for i, (x, y) in enumerate(batches):
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x).float(), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                if i // ACCUMULATE in poison:
                    next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = INF
                if clip is not None:
                    norms.append(accelerator.clip_grad_norm_(model.parameters(), clip).item())
            opt.step()
            scheduler.step()
            opt.zero_grad()
            if accelerator.sync_gradients:
                skipped.append(accelerator.optimizer_step_was_skipped)
                if log is not None:
                    log(i // ACCUMULATE, model, scheduler)
        losses.append(loss.item())
    unwrapped = accelerator.unwrap_model(model)
    return {"losses": losses, "norms": norms, "skipped": skipped, "params": [p.detach().clone() for p in unwrapped.parameters()]}


def engine_loop(policy: str, batches: list[Batch], poison: set[int] = frozenset(), clip: float | None = CLIP, **engine_args: Any) -> dict[str, Any]:
    """The control: the plain ampkit.Engine loop on the same weights, batches and schedule."""
    model = _net()
    opt = _opt(model.parameters())
    engine = ampkit.Engine(policy, accumulate=ACCUMULATE, clip_grad_norm=clip, **engine_args)
    if _converts(policy):
        model, opt = engine.setup(model, opt)
        scheduler = _schedule(opt)  # on the library twin setup() returns, stepped below on real steps
    else:
        scheduler = _schedule(opt)
        model, opt = engine.setup(model, opt, schedulers=scheduler)
    losses, norms, skipped = [], [], []
    for i, (x, y) in enumerate(batches):
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if engine.is_boundary and i // ACCUMULATE in poison:
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = INF
        if engine.step():
            if clip is not None:
                norms.append(engine.grad_norm)
            skipped.append(engine.step_was_skipped)
            if _converts(policy) and not engine.step_was_skipped:
                scheduler.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms, "skipped": skipped, "params": [p.detach().clone() for p in model.parameters()], "engine": engine}


def _equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(torch.tensor(a["norms"]), torch.tensor(b["norms"]), rtol=0, atol=0, equal_nan=True)
    assert a["skipped"] == b["skipped"]
    for p, q in zip(a["params"], b["params"]):
        assert p.dtype == q.dtype
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------------------------------------ against Accelerate
def test_bf16_mixed_trains_as_accelerates_own_bf16_bit_for_bit() -> None:
    """Same autocast, same division by the window, same clipping: the same numbers. Tolerance 0, and not vacuously:
    the fp32 run (same weights and batches) lands measurably elsewhere, so the policy did run in bf16."""
    data = _batches()
    native = accelerate_loop(fresh(lambda: Accelerator(mixed_precision="bf16", gradient_accumulation_steps=ACCUMULATE)), data)
    ours = accelerate_loop(fresh(lambda: AmpkitAccelerator("bf16-mixed", gradient_accumulation_steps=ACCUMULATE)), data)
    _equal(ours, native)
    fp32 = accelerate_loop(fresh(lambda: Accelerator(gradient_accumulation_steps=ACCUMULATE)), data)
    bf16_from_fp32 = max(abs(a - b) for a, b in zip(native["losses"], fp32["losses"]))
    assert bf16_from_fp32 > 1e-4  # bf16's rounding shows in the loss already


def test_fp32_trains_as_accelerates_fp32_bit_for_bit() -> None:
    data = _batches()
    native = accelerate_loop(fresh(lambda: Accelerator(gradient_accumulation_steps=ACCUMULATE)), data)
    ours = accelerate_loop(fresh(lambda: AmpkitAccelerator("32-true", gradient_accumulation_steps=ACCUMULATE)), data)
    _equal(ours, native)


# ------------------------------------------------------------------------------------------------ against the engine
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_trains_as_the_plain_engine_loop(policy: str) -> None:
    """Accumulation by Accelerate (``accumulate(model)``, 2 micro-batches), clipping through ``clip_grad_norm_``, an
    overflow at step 4 where the loss is scaled: losses, clipped norms, skips and weights equal the plain Engine
    loop's bit for bit, and the loss falls."""
    _available(policy)
    data = _batches()
    scaled = get_policy(policy).loss_scaling == "dynamic"
    poison = {4} if scaled else set()
    ours = accelerate_loop(AmpkitAccelerator(policy, gradient_accumulation_steps=ACCUMULATE), data, poison)
    control = engine_loop(policy, data, poison)
    _equal(ours, control)
    assert ours["skipped"] == [i in poison for i in range(STEPS)]
    losses = torch.tensor(ours["losses"])
    assert losses.isfinite().all()
    assert losses[-6:].mean() < losses[:6].mean() - 0.1, f"{policy} did not learn: {losses.tolist()}"


def test_an_overflow_skips_the_step_and_the_scheduler_and_halves_the_scale() -> None:
    """16-mixed, an inf at step 3: the weights and the learning rate stay as they were, every other step moves them;
    the scale is init * backoff, once."""
    data = _batches()
    seen: list[tuple[list[torch.Tensor], float]] = []
    accelerator = AmpkitAccelerator("16-mixed", scaler=ampkit.ScalerConfig(init_scale=2.0**10), gradient_accumulation_steps=ACCUMULATE)
    out = accelerate_loop(accelerator, data, poison={3},
                          log=lambda step, model, sched: seen.append(([p.detach().clone() for p in model.parameters()], sched.get_last_lr()[0])))
    assert out["skipped"] == [i == 3 for i in range(STEPS)]
    assert accelerator.engine.skipped_steps == 1 and accelerator.engine.scale == 2.0**10 * 0.5
    for step in range(1, STEPS):
        (before, lr_before), (after, lr_after) = seen[step - 1], seen[step]
        same = all(torch.equal(p, q) for p, q in zip(before, after))
        assert same == (step == 3) and (lr_after == lr_before) == (step == 3), step


def test_clip_grad_norm_returns_the_unscaled_norm_of_the_masters_and_clips_them() -> None:
    """16-true-masters (fp16 model, fp32 masters, loss scale 2**16): the returned norm is the unscaled one (the plain
    engine's ``grad_norm`` bit for bit), and what the optimizer steps is clipped."""
    data = _batches(2)
    accelerator = AmpkitAccelerator("16-true-masters", gradient_accumulation_steps=ACCUMULATE)
    model = _net()
    model, opt = accelerator.prepare(model, _opt(model.parameters()))
    for x, y in data:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(x).float(), y))
    norm = accelerator.clip_grad_norm_(model.parameters(), 0.1)
    stepped = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in stepped)
    assert torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in stepped])) <= 0.1 * (1 + 1e-5)
    control = engine_loop("16-true-masters", data, clip=0.1)
    assert norm.item() == control["norms"][0] and 1e-2 < norm.item() < 1e2  # unscaled: not 2**16 times too large
    opt.step()
    for p, q in zip(model.parameters(), control["params"]):
        assert torch.equal(p, q)


def test_clip_grad_value_clamps_the_unscaled_gradients() -> None:
    accelerator = AmpkitAccelerator("16-mixed", scaler=4096.0)
    model = _net()
    model, _ = accelerator.prepare(model, _opt(model.parameters()))
    x, y = _batches(1)[0]
    accelerator.backward(nn.functional.cross_entropy(model(x).float(), y))
    accelerator.clip_grad_value_(model.parameters(), 1e-3)
    assert max(p.grad.abs().max().item() for p in model.parameters()) == pytest.approx(1e-3)  # scaled by 4096, it would not be


def test_two_optimizers_each_report_their_own_skip() -> None:
    """A GAN's two optimizers, each after its own backward: an overflow in the first one's gradients skips it alone, and
    each says so (the engine keeps one outcome: the first one's is read before the second steps)."""
    accelerator = AmpkitAccelerator("16-mixed")
    model = _net()
    first, second = _opt(model[0].parameters()), _opt(model[3].parameters())
    model, first, second = accelerator.prepare(model, first, second)
    x, y = _batches(1)[0]
    accelerator.backward(nn.functional.cross_entropy(model(x).float(), y))
    model[0].weight.grad.view(-1)[0] = INF
    first.step()
    first.zero_grad()
    second.zero_grad()
    before = model[3].weight.detach().clone()
    accelerator.backward(nn.functional.cross_entropy(model(x).float(), y))
    second.step()
    assert (first.step_was_skipped, second.step_was_skipped) == (True, False)
    assert accelerator.optimizer_step_was_skipped and not torch.equal(model[3].weight, before)


@pytest.mark.parametrize("policy", ["16-mixed", "bf16-mixed"])
def test_a_second_optimizer_stepped_after_the_same_scaled_backward_is_refused(policy: str) -> None:
    """Its gradients were scaled by the scale the first step has since updated; unscaled by the new one they would be
    wrong by its change. Without a loss scale the same loop trains, silently (the twin)."""
    accelerator = AmpkitAccelerator(policy)
    model = _net()
    first, second = _opt(model[0].parameters()), _opt(model[3].parameters())
    model, first, second = accelerator.prepare(model, first, second)
    x, y = _batches(1)[0]
    accelerator.backward(nn.functional.cross_entropy(model(x).float(), y))
    first.step()
    if policy == "16-mixed":
        with pytest.raises(RuntimeError, match="second optimizer after the same accelerator.backward"):
            second.step()
    else:
        before = model[3].weight.detach().clone()
        second.step()
        assert not torch.equal(model[3].weight, before)


def test_prepare_adopts_optimizers_whatever_the_order_and_returns_ampkit_optimizers() -> None:
    accelerator = AmpkitAccelerator("bf16-true-remainder")  # one flat master store: both optimizers in one adoption
    model = _net()
    a, b = _opt(model[0].parameters()), _opt(model[3].parameters())
    a, model, b = accelerator.prepare(a, model, b)
    assert isinstance(a, AmpkitOptimizer) and isinstance(b, AmpkitOptimizer)
    assert model[0].weight.dtype == torch.bfloat16
    assert len(accelerator.engine.optimizers) == 2 and accelerator.engine.masters is not None


def test_the_forward_runs_in_the_policy_and_unwraps_as_accelerates() -> None:
    accelerator = AmpkitAccelerator("bf16-mixed")
    model = accelerator.prepare(_net())
    x = torch.randn(2, 8)
    out = model(x)
    assert out.dtype == torch.float32  # bf16 inside, fp32 out, as Accelerate's convert_outputs_to_fp32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert vars(plain)["forward"].__func__ is nn.Sequential.forward  # the wrappers are off
    assert not torch.equal(plain(x), out)  # now in fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(plain(x).float(), out)


def test_autocast_is_the_policys_and_an_fp32_block_may_opt_out() -> None:
    from accelerate.utils import AutocastKwargs

    accelerator = AmpkitAccelerator("bf16-mixed")
    accelerator.prepare(_net())
    a = torch.randn(4, 4)
    with accelerator.autocast():
        assert (a @ a).dtype == torch.bfloat16
        with accelerator.autocast(AutocastKwargs(enabled=False)):
            assert (a @ a).dtype == torch.float32
    with pytest.raises(ValueError, match="only AutocastKwargs\\(enabled=False\\)"), accelerator.autocast(AutocastKwargs(cache_enabled=True)):
        pass


# ------------------------------------------------------------------------------------------------ the tools
def test_the_doctor_samples_in_the_loop_and_the_tools_take_the_prepared_model() -> None:
    """numerics=1 samples how the gradients fit fp16 at every step of the Accelerate loop; the memory estimate and the
    doctor take the prepared model once Accelerate's wrapping is off (unwrap_model(keep_fp32_wrapper=False)), and
    estimate it as they estimate the model never prepared (bf16-mixed keeps the parameters fp32)."""
    accelerator = AmpkitAccelerator("bf16-mixed", numerics=1)
    model = _net()
    model, opt = accelerator.prepare(model, _opt(model.parameters()))
    x, y = _batches(1)[0]
    accelerator.backward(nn.functional.cross_entropy(model(x), y))
    opt.step()
    assert accelerator.engine.numerics.last is not None
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    prepared = ampkit.memory.estimate(plain, (x, y), policy="bf16-mixed")
    never = ampkit.memory.estimate(_net(), (x, y), policy="bf16-mixed")
    assert (prepared.parameters, prepared.activations, prepared.peak) == (never.parameters, never.activations, never.peak)
    assert ampkit.numerics.diagnose(plain, [(x, y)], steps=1).recommended_precision
