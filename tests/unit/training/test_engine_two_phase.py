"""``Engine.setup_module`` + ``setup_optimizers`` (optimizers built on the prepared model, as Lightning's Trainer and
Fabric build them) and ``Engine.unscale_`` (gradients read or clipped between backward and step, as the frameworks'
hooks and clipping do).

The control of every claim is the one-call ``Engine.setup(model, optimizer)`` run from the same weights on the same
batches: the two-phase run must match it bit for bit, masters and loss scale included.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.policy import get_policy
from ampkit.policy._islands import is_fp32_island

INF = float("inf")

# Every policy this CPU runs, with an optimizer each converts (kahan/sr take their library twins).
POLICIES = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "bf16-true-masters", "16-true-masters", "bf16-true-remainder",
            "bf16-true-kahan", "bf16-true-sr"]


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))


def _batches(n: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def _adamw(params: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)  # type: ignore[arg-type]


def _available(policy: str) -> None:
    support = get_policy(policy).support("cpu")
    if not support.supported:
        pytest.skip(f"{policy}: {support.reason}")


def _train(
    engine: Engine, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], poison: set[int] = frozenset(),
    before_step: Callable[[], None] | None = None,
) -> list[float]:
    """Train on ``batches``; an inf in one gradient at the steps in ``poison``; ``before_step`` runs before each step."""
    losses = []
    for i, (x, y) in enumerate(batches):
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if i in poison:
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = INF
        if before_step is not None:
            before_step()
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("policy", POLICIES)
def test_optimizers_built_after_the_cast_train_as_the_one_call_setup(policy: str) -> None:
    _available(policy)
    data = _batches()
    control = _net()
    one = Engine(policy, clip_grad_norm=1.0)
    control, _ = one.setup(control, _adamw(control.parameters()))
    want = _train(one, control, data, poison={2} if one.scaler is not None else set())

    model = _net()
    two = Engine(policy, clip_grad_norm=1.0)
    model = two.setup_module(model)
    two.setup_optimizers(_adamw(model.parameters()))  # built on the 16-bit model
    got = _train(two, model, data, poison={2} if two.scaler is not None else set())

    same = dict(rtol=0, atol=0, equal_nan=True)  # 16-true's fp16 AdamW goes NaN: alike in both runs
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **same)
    for (name, p), q in zip(model.named_parameters(), control.parameters()):
        assert p.dtype == q.dtype, name
        torch.testing.assert_close(p, q, **same, msg=name)
    if one.masters is not None:
        assert [m.dtype for m in two.masters.masters] == [torch.float32] * len(one.masters.masters)
        for a, b in zip(one.masters.state_dict().values(), two.masters.state_dict().values()):
            assert torch.equal(a, b)
    assert two.skipped_steps == one.skipped_steps and two.scale == one.scale


def test_masters_come_from_the_fp32_values_not_the_rounded_weights() -> None:
    model = _net()
    fp32 = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = Engine("bf16-true-masters")
    model = engine.setup_module(model)
    engine.setup_optimizers(_adamw(model.parameters()))
    masters = engine.masters.state_dict()
    assert masters and all(torch.equal(masters[n], fp32[n]) for n in masters)
    assert not all(torch.equal(masters[n], fp32[n].bfloat16().float()) for n in masters)  # the rounded weights would differ


def test_the_kept_values_are_dropped_once_the_optimizers_hold_their_masters() -> None:
    model = _net()
    model[0].requires_grad_(False)  # a frozen layer: no optimizer will want its fp32 values
    engine = Engine("bf16-true-masters")
    model = engine.setup_module(model)
    assert len(engine._run.values) == 4  # both Linear layers' weight and bias (the LayerNorm stays fp32)
    engine.setup_optimizers(_adamw([p for p in model.parameters() if p.requires_grad]))
    assert engine._run.values == {}


def test_a_second_optimizer_adopted_at_its_first_step_trains_as_the_one_call_setup() -> None:
    """A GAN's two optimizers met one at a time (as a framework adopting each at its first step sees them)."""
    data = _batches(4)

    def run(two_phase: bool) -> nn.Module:
        model = _net()
        engine = Engine("16-true-masters")
        if two_phase:
            model = engine.setup_module(model)
            a, b = _adamw(model[0].parameters()), _adamw(model[3].parameters())
        else:
            a, b = _adamw(model[0].parameters()), _adamw(model[3].parameters())
            model, a, b = engine.setup(model, a, b)
        for i, (x, y) in enumerate(data):
            for opt in (a, b):
                with engine.autocast():
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                engine.backward(loss)
                if two_phase and i == 0:
                    engine.setup_optimizers(opt)
                engine.step(opt)
        return model

    for p, q in zip(run(True).parameters(), run(False).parameters()):
        assert torch.equal(p, q)


def test_bf16_true_remainder_takes_its_optimizers_in_one_call() -> None:
    engine = Engine("bf16-true-remainder")
    model = engine.setup_module(_net())
    engine.setup_optimizers(_adamw(model[0].parameters()))
    with pytest.raises(ValueError, match="one setup_optimizers"):
        engine.setup_optimizers(_adamw(model[3].parameters()))


def test_misuse_of_the_two_calls_is_refused_with_the_fix() -> None:
    engine = Engine("bf16-mixed")
    model = engine.setup_module(_net())
    engine.backward(model(torch.ones(2, 8)).sum())  # a backward may run before the optimizers come
    with pytest.raises(RuntimeError, match="before setup_optimizers"):
        engine.step()
    opt = _adamw(model.parameters())
    engine.setup_optimizers(opt)
    with pytest.raises(ValueError, match="set up already"):
        engine.setup_optimizers(opt)
    one = Engine()
    net = _net()
    one.setup(net, _adamw(net.parameters()))
    with pytest.raises(RuntimeError, match="follows setup_module"):
        one.setup_optimizers(_adamw(net.parameters()))


def test_islands_made_for_the_target_device_follow_the_model_to_where_it_trains() -> None:
    """setup_module(device=...) casts for the device a framework will move the model to; setup_optimizers reads where
    the model really is and points the fp32 islands' autocast there."""
    engine = Engine("bf16-true-masters")
    model = engine.setup_module(_net(), device="cuda")  # a Lightning GPU run converts before it moves the model
    assert model[1].forward.args[1] == "cuda" and is_fp32_island(model[1])
    engine.setup_optimizers(_adamw(model.parameters()))  # the model stayed on the CPU here
    assert model[1].forward.args[1] == "cpu" and engine.device == torch.device("cpu")


# ------------------------------------------------------------------------------------------------ unscale_
@pytest.mark.parametrize("policy", ["16-mixed", "16-true-masters", "bf16-true-masters", "bf16-mixed"])
def test_unscale_then_clip_by_hand_matches_the_engine_clipping(policy: str) -> None:
    """GradScaler's protocol (unscale_, clip the optimizer's parameters, step) against Engine(clip_grad_norm=...),
    with an overflow at a known step: the same skips, scale and weights, bit for bit."""
    data = _batches()
    poison = {2} if get_policy(policy).loss_scaling == "dynamic" else set()
    control = _net()
    one = Engine(policy, clip_grad_norm=0.5)
    control, _ = one.setup(control, _adamw(control.parameters()))
    _train(one, control, data, poison)

    model = _net()
    two = Engine(policy)
    model, opt = two.setup(model, _adamw(model.parameters()))

    def unscale_and_clip() -> None:
        two.unscale_()
        params = [p for g in opt.param_groups for p in g["params"]]  # the masters, where there are
        torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=True)

    _train(two, model, data, poison, before_step=unscale_and_clip)
    for p, q in zip(model.parameters(), control.parameters()):
        assert torch.equal(p, q)
    assert two.skipped_steps == one.skipped_steps == len(poison) and two.scale == one.scale


def test_unscale_shows_the_true_gradients_and_is_refused_where_it_would_mix_scales() -> None:
    model = _net()
    ref = copy.deepcopy(model)
    engine = Engine("16-mixed", accumulate=2)
    model, _ = engine.setup(model, _adamw(model.parameters()))
    x, y = _batches(1)[0]
    with engine.autocast():
        loss = nn.functional.cross_entropy(model(x).float(), y)
    engine.backward(loss)
    with pytest.raises(RuntimeError, match="inside an accumulation window"):
        engine.unscale_()
    engine.step()
    with engine.autocast():
        loss = nn.functional.cross_entropy(model(x).float(), y)
    engine.backward(loss)
    engine.unscale_()
    with torch.autocast("cpu", dtype=torch.float16):
        want = nn.functional.cross_entropy(ref(x).float(), y)
    want.backward()
    assert torch.allclose(model[0].weight.grad, ref[0].weight.grad, rtol=1e-2, atol=1e-5)  # each half of the window
    with pytest.raises(RuntimeError, match="already"):
        engine.unscale_()
    with pytest.raises(RuntimeError, match=r"after engine.unscale_\(\)"):
        engine.backward(loss)


def test_hooks_see_the_gradients_before_unscale_once_per_step() -> None:
    seen: list[float] = []
    steps: list[int] = []

    class Grads:
        def before_optimizer_step(self, engine: Engine) -> None:
            seen.append(engine.models[0][3].bias.grad.abs().sum().item())
            steps.append(engine.steps)  # the step being taken, counted, as in a step without unscale_

    engine = Engine("16-mixed", scaler=1024.0, hooks=[Grads()])
    net = _net()
    model, _ = engine.setup(net, torch.optim.SGD(net.parameters(), lr=0.0))
    x, y = _batches(1)[0]
    engine.backward(nn.functional.cross_entropy(model(x), y))
    scaled = model[3].bias.grad.abs().sum().item()
    engine.unscale_()
    engine.step()
    assert seen == [scaled] and steps == [1]  # once, with the scaled gradients the backward left
    assert engine.steps == 1
