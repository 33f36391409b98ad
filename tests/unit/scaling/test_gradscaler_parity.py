"""ampkit's loss scaling against ``torch.amp.GradScaler`` of the same device, bitwise, over a mixed-precision run.

Control: torch's documented loop (autocast in the device's 16-bit type, ``GradScaler(device.type)``, ``scaler.step``).
Treatments, on the same weights and data: ampkit's scaler driven by hand, and the Engine. The run overflows on the
very first step (a bad batch), again mid-run, and, on CUDA's fp16, whenever the scale outgrows fp16's range (a
2**20 start and growth every 3 clean steps make it oscillate; the GPU run is longer, its steps cost nothing); it
grows and backs off. After every step the scale,
the growth tracker, the parameters and the optimizer state must be bitwise equal, with unfused and fused optimizers
and, for fused ones, 16-bit parameters too. Device-generic: on the CPU pass the control is GradScaler("cpu") with
bfloat16 autocast.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ampkit import Engine
from ampkit.scaling import DynamicLossScaler, ScalerConfig
from ampkit.scaling._kernels import grads_of

BAD_BATCHES = (0, 7)
INIT, INTERVAL = 2.0**20, 3
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    # Fused SGD with momentum is left out: an overflowed first step leaves its momentum uninitialised under
    # GradScaler too (test_kernel_guards.py), so the control itself would be garbage.
    "sgd-fused": lambda ps: torch.optim.SGD(ps, lr=0.05, fused=True),
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, fused=True),
}
CASES = [(name, False) for name in OPTIMIZERS] + [("adamw-fused", True)]  # True: 16-bit parameters (fused only)


def _steps(device: torch.device) -> int:
    return 12 if device.type == "cpu" else 40


def _data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    steps, gen = _steps(device), torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 16, 32, generator=gen)
    xs[list(BAD_BATCHES), 3, 5] = float("inf")  # a corrupt sample: inf loss, non-finite gradients
    ys = torch.randint(0, 10, (steps, 16), generator=gen)
    return xs.to(device), ys.to(device)


def _model(device: torch.device, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10)).to(device, dtype)


class _Run:
    """One training run's observable state after each step."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt
        self.history: list[tuple[float, int]] = []  # (scale, growth tracker)

    def assert_equal(self, other: _Run, step: int) -> None:
        assert self.history[-1] == other.history[-1], f"step {step}: (scale, growth tracker)"
        for a, b in zip(self.model.parameters(), other.model.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: parameters differ"
        for a, b in zip(self.model.parameters(), other.model.parameters()):
            sa, sb = self.opt.state.get(a, {}), other.opt.state.get(b, {})
            assert sa.keys() == sb.keys(), step
            for key in sa:
                assert torch.equal(torch.as_tensor(sa[key]), torch.as_tensor(sb[key])), f"step {step}: optimizer state {key!r}"


def _control(device, half_dtype, make, half_params) -> _Run:
    model = _model(device, half_dtype if half_params else torch.float32)
    run = _Run(model, make(model.parameters()))
    run.scaler = torch.amp.GradScaler(device.type, init_scale=INIT, growth_interval=INTERVAL)  # type: ignore[attr-defined]
    return run


def _control_step(run: _Run, x, y, device, half_dtype) -> None:
    run.opt.zero_grad()
    with torch.autocast(device.type, dtype=half_dtype):
        loss = F.cross_entropy(run.model(x.to(next(run.model.parameters()).dtype)), y)
    run.scaler.scale(loss).backward()  # type: ignore[attr-defined]
    run.scaler.step(run.opt)  # type: ignore[attr-defined]
    run.scaler.update()  # type: ignore[attr-defined]
    run.history.append((run.scaler.get_scale(), int(run.scaler._get_growth_tracker())))  # type: ignore[attr-defined]


def _ours_config() -> ScalerConfig:
    # GradScaler has no floor or ceiling: ampkit's are set out of the run's reach.
    return ScalerConfig(init_scale=INIT, growth_interval=INTERVAL, min_scale=1.0, max_scale=2.0**100)


def _scaler_step(run: _Run, scaler: DynamicLossScaler, x, y, device, half_dtype) -> None:
    """ampkit's scaler by hand, as the engine drives it: check in the fused kernel, or unscale and skip on the host."""
    run.opt.zero_grad()
    with torch.autocast(device.type, dtype=half_dtype):
        loss = F.cross_entropy(run.model(x.to(next(run.model.parameters()).dtype)), y)
    scaler.scale(loss).backward()
    found = torch.zeros((), device=device)
    grads = grads_of(run.model.parameters())
    if getattr(run.opt, "_step_supports_amp_scaling", False):
        scaler.check_(grads, found)
        run.opt.grad_scale, run.opt.found_inf = scaler.scale_tensor, found  # type: ignore[attr-defined]
        run.opt.step()
        del run.opt.grad_scale, run.opt.found_inf  # type: ignore[attr-defined]
    else:
        scaler.unscale_(grads, found)
        if not found.item():
            run.opt.step()
    scaler.update(found)
    run.history.append((scaler.get_scale(), int(scaler.state_dict()["growth_tracker"])))


def _gradscaler_refuses(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why torch's GradScaler cannot unscale ``dtype`` gradients on ``device`` (its kernel lacks the dtype: bf16 on
    CUDA, where ``--half bf16`` puts the 16-bit parameters), or None. ampkit's scaler has a fallback for it."""
    try:
        torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(1, dtype=dtype, device=device)], torch.zeros((), device=device), torch.ones((), device=device))
    except (NotImplementedError, RuntimeError) as error:
        return str(error).splitlines()[0]
    return None


@pytest.mark.parametrize("treatment", ["scaler", "engine"])
@pytest.mark.parametrize(("name", "half_params"), CASES, ids=[f"{n}{'-16bit-params' if h else ''}" for n, h in CASES])
def test_bitwise_equal_to_torch_gradscaler(device, half_dtype, mixed_policy, name, half_params, treatment):
    if half_params and (refused := _gradscaler_refuses(half_dtype, device)):
        pytest.skip(f"the control, torch's GradScaler, cannot unscale {half_dtype} parameters' gradients on {device.type}: {refused}")
    make = OPTIMIZERS[name]
    xs, ys = _data(device)
    control = _control(device, half_dtype, make, half_params)
    model = copy.deepcopy(control.model)
    if treatment == "scaler":
        ours = _Run(model, make(model.parameters()))
        scaler = DynamicLossScaler(_ours_config(), device)
    else:
        precision = ("16-true" if half_dtype == torch.float16 else "bf16-true") if half_params else mixed_policy
        engine = Engine(precision, scaler=_ours_config())
        model, opt = engine.setup(model, make(model.parameters()))
        ours = _Run(model, opt)
    for step in range(_steps(device)):
        _control_step(control, xs[step], ys[step], device, half_dtype)
        if treatment == "scaler":
            _scaler_step(ours, scaler, xs[step], ys[step], device, half_dtype)
        else:
            with engine.autocast():
                loss = F.cross_entropy(model(xs[step].to(next(model.parameters()).dtype)), ys[step])
            engine.backward(loss)
            engine.step()
            ours.history.append((engine.scaler.get_scale(), int(engine.scaler.state_dict()["growth_tracker"])))
        control.assert_equal(ours, step)
    scales = [INIT] + [s for s, _ in control.history]
    backoffs = sum(b < a for a, b in itertools.pairwise(scales))
    assert scales[1] < INIT, "the very first step must overflow and be skipped"
    assert backoffs >= len(BAD_BATCHES) and any(b > a for a, b in itertools.pairwise(scales)), scales  # backed off and grew
    if treatment == "engine":
        assert engine.skipped_steps == backoffs
