"""NumericsSampler through the Engine: every figure is checked against a hand count on a reference run.

The references are plain torch backward passes of a copy of the model (same weights, same batch) whose
gradients are counted directly (``0 < |g| < 2^-24`` and so on); the sampler's histogram-based figures must
agree exactly. Training itself must not change: parameters with and without the sampler are bitwise equal.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections import OrderedDict

import pytest
import torch
from torch import nn

from ampkit import Engine, ScalerConfig, get_policy
from ampkit.numerics._sampler import NumericsSample, NumericsSampler

FP16_TINY = 2.0**-24


class _ShrinkGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``factor``, so everything upstream gets tiny
    gradients while the forward (and the layers downstream) stay normal."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad * ctx.factor, None


class ShrinkGrad(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ShrinkGrad.apply(x, self.factor)


class Boost(nn.Module):
    """Multiplies its input by ``factor`` (activations beyond fp16's range when large)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def mlp(seed: int = 0, middle: nn.Module | None = None) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU())
    if middle is not None:
        layers["mid"] = middle
    layers["fc2"] = nn.Linear(16, 3)
    return nn.Sequential(layers)


def batches(n: int, size: int = 8, seed: int = 1, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Drawn on the CPU and moved, so every device sees the same values.
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 8, generator=g).to(device), torch.randint(0, 3, (size,), generator=g).to(device)) for _ in range(n)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.float(), y)


def train(engine: Engine, model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], lr: float = 0.1) -> nn.Module:
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    for x, y in data:
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        engine.step()
    return model


def reference_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float | None, autocast: torch.dtype | None) -> nn.Module:
    """A copy of ``model`` after a plain torch backward of ``loss * scale`` (gradients as the engine's backward makes them)."""
    ref = copy.deepcopy(model)
    with torch.autocast(x.device.type, dtype=autocast, enabled=autocast is not None):
        loss = loss_fn(ref(x), y)
    (loss * scale if scale is not None else loss).backward()
    return ref


def skip_unless_supported(precision: str, device: torch.device) -> None:
    support = get_policy(precision).support(device)
    if not support.supported:
        pytest.skip(f"{precision} does not run on {device}: {support.reason}")


def hooks_on(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


# ------------------------------------------------------------------------------------------ when
def test_samples_exactly_on_multiples_of_every(device: torch.device) -> None:
    seen: list[int] = []
    engine = Engine(numerics=NumericsSampler(every=3, callback=lambda s: seen.append(s.step)))
    train(engine, mlp().to(device), batches(7, device=device))
    assert engine.steps == 7
    assert seen == [3, 6]
    assert engine.numerics.last.step == 6


def test_accumulation_samples_at_the_boundary_with_the_last_micro_batch_activations(device: torch.device) -> None:
    seen: list[NumericsSample] = []
    engine = Engine(accumulate=2, numerics=NumericsSampler(every=2, callback=seen.append))
    train(engine, mlp().to(device), batches(8, size=5, device=device))  # 4 optimizer steps
    assert [s.step for s in seen] == [2, 4]
    # The recorded forward is the boundary micro-batch's alone: 5 rows through fc1's 16 outputs.
    assert seen[-1].modules["fc1"]["outputs"].count == 5 * 16
    assert seen[-1].modules["fc1"]["output_grads"].count == 5 * 16


def test_train_step_passes_of_one_batch_are_recorded_together() -> None:
    engine = Engine(micro_batch_rows=2, numerics=1)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(1, size=5)[0]
    engine.train_step(lambda b: loss_fn(model(b[0]), b[1]), (x, y))  # three passes: 2, 2 and 1 rows
    s = engine.numerics.last
    assert s.step == 1
    assert s.modules["fc1"]["outputs"].count == 5 * 16 and s.modules["fc1"]["output_grads"].count == 5 * 16


def test_non_sampled_forwards_register_no_hooks() -> None:
    engine = Engine(accumulate=2, numerics=3)
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    counts = []
    for x, y in batches(6):  # micro-batches 5 and 6 make optimizer step 3, the sampled one
        with engine.autocast():
            counts.append(hooks_on(model))
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        engine.step()
        assert hooks_on(model) == 0  # forward hooks are gone once the context exits
    assert counts[:5] == [0] * 5
    assert counts[5] == len(list(model.modules()))  # the boundary micro-batch of step 3: one per module
    assert engine.numerics.last.step == 3


def test_activations_off_registers_no_hooks_and_reads_gradients_only() -> None:
    engine = Engine(numerics=NumericsSampler(every=1, activations=False))
    model = mlp()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(1)[0]
    with engine.autocast():
        assert hooks_on(model) == 0
        loss = loss_fn(model(x), y)
    engine.backward(loss)
    engine.step()
    s = engine.numerics.last
    assert sorted(s.modules) == ["fc1", "fc2"] and all(list(k) == ["grads"] for k in s.modules.values())
    assert s.act_max_abs is None and not any(k.startswith("numerics/act_") for k in s.to_scalars())


# ------------------------------------------------------------------------------------------ what
@pytest.mark.parametrize(
    "precision, scaler, factor, autocast",
    [("32-true", 2.0**10, 2.0**-30, None), ("bf16-mixed", None, 2.0**-20, torch.bfloat16)],
    ids=["32-true-static-2^10", "bf16-mixed-unscaled"],
)
def test_tiny_gradients_are_named_worst_with_the_hand_counted_underflow_share(
    precision: str, scaler: float | None, factor: float, autocast: torch.dtype | None, device: torch.device
) -> None:
    skip_unless_supported(precision, device)
    model = mlp(middle=ShrinkGrad(factor)).to(device)
    x, y = batches(1, device=device)[0]
    ref = reference_grads(model, x, y, scaler, autocast)
    grads = torch.cat([ref.fc1.weight.grad.reshape(-1), ref.fc1.bias.grad.reshape(-1)])
    expected = ((grads != 0) & (grads.abs() < FP16_TINY)).sum().item() / grads.numel()
    assert 0.05 < expected < 0.95, "the case must leave some values on each side of 2^-24"

    engine = Engine(precision, scaler=scaler if scaler is not None else "none", numerics=NumericsSampler(every=1, top=2))
    train(engine, model, [(x, y)])
    s = engine.numerics.last
    assert s.scale == scaler
    assert s.worst[0].name == "fc1" and s.worst[0].issue == "underflow"
    assert s.worst[0].share == expected
    assert s.modules["fc1"]["grads"].share("fp16", "underflow") == expected
    fc2 = torch.cat([ref.fc2.weight.grad.reshape(-1), ref.fc2.bias.grad.reshape(-1)])
    everything = torch.cat([grads, fc2])
    assert s.grad_underflow_share == ((everything != 0) & (everything.abs() < FP16_TINY)).sum().item() / everything.numel()
    subnormal = ((everything.abs() >= FP16_TINY) & (everything.abs() < 2.0**-14)).sum().item() / everything.numel()
    assert s.grad_subnormal_share == subnormal
    assert s.grad_zero_share == (everything == 0).sum().item() / everything.numel()


@pytest.mark.parametrize(
    "precision, scaler, autocast",
    [("32-true", None, None), ("32-true", 2.0**10, None), ("32-true", ScalerConfig(init_scale=2.0**12), None), ("bf16-mixed", None, torch.bfloat16)],
    ids=["32-true", "static-2^10", "dynamic-2^12", "bf16-mixed"],
)
def test_suggested_scale_and_headroom_match_a_reference_backward(precision: str, scaler, autocast: torch.dtype | None, device: torch.device) -> None:
    skip_unless_supported(precision, device)
    model = mlp().to(device)
    x, y = batches(1, device=device)[0]
    ref = reference_grads(model, x, y, None, autocast)
    g_max = max(p.grad.abs().max().item() for p in ref.parameters())
    engine = Engine(precision, scaler=scaler if scaler is not None else "none", numerics=1)
    train(engine, model, [(x, y)])
    s = engine.numerics.last
    scale = s.scale or 1.0
    assert s.suggested_scale == 2.0 ** math.floor(math.log2(65504 / g_max))
    assert s.grad_max_abs == g_max * scale  # a power-of-two scale is exact
    assert s.headroom == pytest.approx(math.log2(65504 / (g_max * scale)), abs=1e-12)


def test_activation_above_fp16_max_is_overflow_of_that_module(device: torch.device) -> None:
    """bf16 holds 1e6 * x, so nothing is wrong in this run (no WARNING), but fp16 would overflow: reported."""
    skip_unless_supported("bf16-mixed", device)
    model = mlp(middle=Boost(1e6)).to(device)
    x, y = batches(1, device=device)[0]
    with torch.autocast(device.type, dtype=torch.bfloat16):
        h = model.act(model.fc1(x))
        out = model.mid(h)
    expected = (out.float().abs() > 65504).sum().item() / out.numel()
    assert expected > 0.1
    engine = Engine("bf16-mixed", numerics=1)
    train(engine, model, [(x, y)])
    s = engine.numerics.last
    assert next(w.name for w in s.worst if w.issue == "overflow") == "mid"
    assert s.modules["mid"]["outputs"].share("fp16", "overflow") == expected
    assert s.modules["fc1"]["outputs"].overflow["fp16"] == 0
    assert s.act_max_abs == out.float().abs().max().item()
    assert s.problems == []  # bf16-mixed: the fp16 figure is information, not a problem


def test_overflow_warns_with_the_fix_when_fp16_limits_bind(caplog: pytest.LogCaptureFixture) -> None:
    model = mlp(middle=Boost(1e6))
    with caplog.at_level(logging.INFO, logger="ampkit"):
        train(Engine("32-true", scaler=2.0**4, numerics=1), model, batches(1))  # a scaled loss: fp16 is the target
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "ampkit.numerics"]
    assert len(warnings) == 1
    assert "exceed fp16's 65504" in warnings[0] and "keep_fp32=['mid']" in warnings[0]


def test_fp16_activation_overflow_is_non_finite_and_warns(caplog: pytest.LogCaptureFixture, device: torch.device) -> None:
    model = mlp(middle=Boost(1e6)).to(device)
    with caplog.at_level(logging.INFO, logger="ampkit"):
        engine = Engine("16-mixed", numerics=1)
        trained = train(engine, model, batches(1, device=device))
    s = engine.numerics.last
    assert s.act_nonfinite > 0 and s.worst[0].name == "mid" and s.worst[0].issue == "non-finite"
    assert s.modules["fc1"]["outputs"].nonfinite == 0
    assert engine.step_was_skipped and trained is model
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "ampkit.numerics"]
    assert len(warnings) == 1 and "non-finite" in warnings[0] and "starting in mid" in warnings[0] and "keep_fp32=['mid']" in warnings[0]


def test_flushed_gradients_warn_and_name_the_raise(caplog: pytest.LogCaptureFixture) -> None:
    model = mlp(middle=ShrinkGrad(2.0**-40))
    with caplog.at_level(logging.INFO, logger="ampkit"):
        engine = Engine("32-true", scaler=2.0**4, numerics=1)
        train(engine, model, batches(1))
    s = engine.numerics.last
    assert s.grad_underflow_share > 0.01
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == "ampkit.numerics"]
    assert len(info) == 1
    assert info[0].startswith("numerics @ step 1 (scale 2^4): grads ")
    assert "below fp16's 2^-24" in info[0] and "worst: fc1 (" in info[0] and "underflow)" in info[0]
    assert f"suggested scale 2^{int(math.log2(s.suggested_scale))}" in info[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "ampkit.numerics"]
    assert len(warnings) == 1 and "flush to zero" in warnings[0] and "fc1" in warnings[0]
    assert f"init_scale={s.suggested_scale:g}" in warnings[0]


def test_a_clean_fp16_sample_logs_info_and_no_warning(caplog: pytest.LogCaptureFixture, device: torch.device) -> None:
    with caplog.at_level(logging.INFO, logger="ampkit"):
        train(Engine("16-mixed", numerics=2), mlp().to(device), batches(4, device=device))
    ours = [r for r in caplog.records if r.name == "ampkit.numerics"]
    assert [r.levelno for r in ours] == [logging.INFO, logging.INFO]
    assert ours[0].getMessage().startswith("numerics @ step 2 (scale 2^16): ")


def test_to_scalars_are_flat_floats() -> None:
    engine = Engine("16-mixed", numerics=1)
    train(engine, mlp(), batches(1))
    scalars = engine.numerics.last.to_scalars()
    assert all(k.startswith("numerics/") and isinstance(v, float) for k, v in scalars.items())
    s = engine.numerics.last
    assert scalars["numerics/loss_scale"] == 2.0**16 == s.scale
    assert scalars["numerics/grad_underflow_share"] == s.grad_underflow_share
    assert scalars["numerics/suggested_scale"] == s.suggested_scale
    assert scalars["numerics/act_overflow_share"] == 0.0


# ------------------------------------------------------------------------------------------ setups
def test_master_weights_sample_the_16_bit_gradients(device: torch.device) -> None:
    model = mlp().to(device)
    x, y = batches(1, device=device)[0]
    engine = Engine("16-true-masters", numerics=1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with engine.autocast():
        loss = loss_fn(model(x), y)
    engine.backward(loss)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    engine.step()
    s = engine.numerics.last
    assert all(g.dtype == torch.float16 for g in grads.values())
    fc1 = torch.cat([grads["fc1.weight"].reshape(-1), grads["fc1.bias"].reshape(-1)]).float()
    assert s.modules["fc1"]["grads"].max_abs == fc1.abs().max().item()  # scaled, as the fp16 backward left it
    assert s.modules["fc1"]["grads"].zeros == (fc1 == 0).sum().item()
    assert s.scale == 2.0**16


def test_several_models_are_prefixed_by_index() -> None:
    a, b = mlp(0), mlp(1)
    engine = Engine("bf16-mixed", numerics=1)
    (a, b), _opt = engine.setup([a, b], torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1))
    x, y = batches(1)[0]
    with engine.autocast():
        loss = loss_fn(a(x), y) + loss_fn(b(x), y)
    engine.backward(loss)
    engine.step()
    s = engine.numerics.last
    assert {"0.fc1", "0.fc2", "1.fc1", "1.fc2", "0", "1"} <= set(s.modules)
    assert s.modules["1.fc2"]["grads"].count == 16 * 3 + 3


@pytest.mark.parametrize(
    "precision, accumulate",
    [("16-mixed", 1), ("16-mixed", 2), ("bf16-mixed", 1), ("16-true-masters", 2), ("32-true", 1), ("bf16-true", 1), ("bf16-true", 2)],
)
def test_training_is_bitwise_unchanged_by_sampling(precision: str, accumulate: int, device: torch.device) -> None:
    skip_unless_supported(precision, device)
    data = batches(8, device=device)
    control = train(Engine(precision, accumulate=accumulate), mlp().to(device), data)
    engine = Engine(precision, accumulate=accumulate, numerics=1)
    treatment = train(engine, mlp().to(device), data)
    assert engine.numerics.last.step == 8 // accumulate
    for (name, p), q in zip(treatment.named_parameters(), control.parameters()):
        assert torch.equal(p, q), f"parameter {name} differs"


def _syncs_in_a_step(device: torch.device, precision: str, numerics: NumericsSampler | None) -> int:
    """Host-device syncs torch's CUDA sync debug mode reports during optimizer step 3 (steps 1 and 2 warm up)."""
    engine = Engine(precision, numerics=numerics)
    model = mlp().to(device)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    train_steps = batches(3, device=device)
    for x, y in train_steps[:2]:
        with engine.autocast():
            loss = loss_fn(model(x), y)
        engine.backward(loss)
        engine.step()
    torch.cuda.synchronize(device)
    x, y = train_steps[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with engine.autocast():
                loss = loss_fn(model(x), y)
            engine.backward(loss)
            engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # Only the syncs' own reports: set_sync_debug_mode's once-per-process notice ("... does not yet detect all
    # synchronizing operations") would count one in whichever run first set the mode in this process.
    return sum(str(w.message).startswith("called a synchronizing CUDA operation") for w in caught)


@pytest.mark.parametrize("audited", [False, True], ids=["mixed", "bf16-true"])
def test_a_sampled_step_adds_exactly_one_host_device_sync(device: torch.device, mixed_policy: str, audited: bool) -> None:
    """Treatment: the step the sampler reads (hooks on every module, every gradient; under bf16-true also the
    update audit's shadow step); control: the same step without a sampler. The sample's statistics come back in
    one transfer, so the difference is exactly one."""
    if device.type != "cuda":
        pytest.skip("counts syncs with torch.cuda.set_sync_debug_mode; on the CPU the host is the device")
    precision = "bf16-true" if audited else mixed_policy
    skip_unless_supported(precision, device)
    control = _syncs_in_a_step(device, precision, None)
    sampler = NumericsSampler(every=3)
    treatment = _syncs_in_a_step(device, precision, sampler)
    assert sampler.last is not None and sampler.last.step == 3 and sampler.last.activations
    assert (sampler.last.updates is not None) == audited
    assert treatment - control == 1, f"{treatment} syncs with the sampler, {control} without"


# ------------------------------------------------------------------------------------------ parts
@pytest.mark.parametrize("every", [0, -2, 1.5, True, "3"])
def test_bad_every_is_refused_with_the_fix(every) -> None:
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        NumericsSampler(every=every)


def test_engine_numerics_argument() -> None:
    assert Engine().numerics is None
    assert Engine(numerics=5).numerics.every == 5
    sampler = NumericsSampler(every=2, activations=False)
    assert Engine(numerics=sampler).numerics is sampler
    with pytest.raises(TypeError, match="pass an int N"):
        Engine(numerics="often")
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        Engine(numerics=0)


def test_overflow_inside_a_module_kept_in_fp32_is_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 2))
    with torch.no_grad():
        model[0].weight.mul_(1e6)  # outputs ~1e5-1e6: beyond fp16, held by fp32 in the kept module
    seen: list[NumericsSample] = []
    engine = Engine("16-mixed", keep_fp32=["0"], numerics=NumericsSampler(every=1, callback=seen.append))
    model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.0))
    with caplog.at_level(logging.INFO, logger="ampkit"):
        with engine.autocast():
            loss = model(torch.randn(16, 8)).float().square().mean()
        engine.backward(loss)
        engine.step()
    (sample,) = seen
    assert sample.act_overflow and sample.act_nonfinite == 0  # the values are there, and harmless
    assert not [w for w in sample.worst if w.issue == "overflow"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert engine.skipped_steps == 0
