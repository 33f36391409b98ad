"""Apex's opt levels against the loops they stand for, on the pass's device in its 16-bit type (fp16 on CUDA,
Apex's default there; bf16 on the CPU): O1 against the torch.amp loop with a GradScaler, O2 against a hand-cast
fp16 model with fp32 master weights. Same weights, data and optimizer; an overflow is injected at one step.

Scaling by powers of two is exact, and both sides run the same kernels in the same order, so the parameters and
the loss scale must be bitwise equal."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ampkit.apex import amp

STEPS, INF_AT = 5, 2


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)


def _batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)  # drawn on the CPU: every device sees the same values
    data = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(STEPS)]
    for i, (x, _) in enumerate(data):
        if i == INF_AT:
            x[0, 0] = float("inf")  # the forward overflows: both sides must skip this step and halve the scale
    return [(x.to(device), y.to(device)) for x, y in data]


def _sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def test_o1_equals_the_torch_amp_loop(device: torch.device, half_dtype: torch.dtype, apex_step, torch_amp_step):
    model = _model(device)
    native = copy.deepcopy(model)
    model, opt = amp.initialize(model, _sgd(model.parameters()), opt_level="O1", half_dtype=half_dtype, verbosity=0)
    native_opt = _sgd(native.parameters())
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16, growth_interval=2000)
    for x, y in _batches(device):
        apex_step(model, opt, x, y)
        torch_amp_step(native, native_opt, scaler, x, y)
    assert amp._amp_state.loss_scalers[0].loss_scale() == scaler.get_scale() == 2.0**15
    for a, b in zip(model.parameters(), native.parameters(), strict=True):
        assert torch.equal(a, b)


def test_o2_equals_a_hand_cast_model_with_fp32_masters(device: torch.device, half_dtype: torch.dtype, apex_step):
    model = _model(device)
    half = copy.deepcopy(model).to(half_dtype)
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]  # fp32, from the same weights
    model, opt = amp.initialize(model, _sgd(model.parameters()), opt_level="O2", half_dtype=half_dtype, verbosity=0)
    assert model[0].weight.dtype == half_dtype
    master_opt, scale = _sgd(masters), 2.0**16
    for x, y in _batches(device):
        apex_step(model, opt, x, y)  # O2 casts the input in and the output to fp32

        half.zero_grad()
        (nn.functional.cross_entropy(half(x.to(half_dtype)).float(), y) * scale).backward()
        grads = [p.grad.float() * (1.0 / scale) for p in half.parameters()]
        if all(bool(g.isfinite().all()) for g in grads):
            for m, g in zip(masters, grads, strict=True):
                m.grad = g
            master_opt.step()
            with torch.no_grad():
                for p, m in zip(half.parameters(), masters, strict=True):
                    p.copy_(m)
        else:
            scale /= 2
    assert amp._amp_state.loss_scalers[0].loss_scale() == scale == 2.0**15
    for a, b in zip(amp.master_params(opt), masters, strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)
    for a, b in zip(model.parameters(), half.parameters(), strict=True):
        assert torch.equal(a, b)
