"""Kernel guards: the table is honest about raw torch, and every fused path the engine takes matches its plain twin.

Sizes reach torch's vectorised code: a 40x40 weight (1600 elements, whole vector blocks) and a 4099-element
parameter (vector blocks plus a scalar tail). The "plain twin" is the same optimizer with ``foreach=True`` on the
same weights, data and injected overflow; the fused run must match it. The engine paths and the first-step defect
are device-generic (``pytest --device cuda`` runs them on the GPU); the CPU 16-bit SGD defect is CPU-only by nature,
and on another device the test of its guard checks the fused kernel is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine, ScalerConfig
from ampkit.training import _kernel_guards as kernel_guards
from ampkit.training._kernel_guards import KNOWN_DEFECTS, KernelDefect, defects_for, first_step_pending, guard_optimizer, torch_affected

DEFECTS = {d.name: d for d in KNOWN_DEFECTS}
SGD_16BIT = DEFECTS["fused-sgd-cpu-16bit"]
SGD_FIRST_STEP = DEFECTS["fused-sgd-skipped-first-step"]
HALF = [torch.float16, torch.bfloat16]
# Per-dtype tolerance between two correct kernels (fused rounds once in fp32, foreach per op).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float16: dict(rtol=4e-3, atol=2e-3), torch.bfloat16: dict(rtol=3e-2, atol=2e-2)}


def requires(defect: KernelDefect) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not torch_affected(defect),
        reason=f"torch {torch.__version__} is outside {defect.name}'s range {defect.torch_versions!r}: the raw kernel is not claimed broken",
    )


def poison_free_memory(*sizes: int, device: torch.device | str = "cpu") -> None:
    """Leave sentinel-filled blocks of ``sizes`` in the allocator's free lists (CUDA's caching allocator too).

    A kernel that reads memory it never wrote then reads 1e30, not the zeros of a fresh page that would hide it.
    """
    junk = [torch.full((n,), 1e30, device=device) for n in sizes for _ in range(4)]
    del junk


def fresh_param(n: int, dtype: torch.dtype, seed: int = 0, device: torch.device | str = "cpu") -> nn.Parameter:
    return nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype))


def grads(n: int, dtype: torch.dtype, steps: int, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, generator=g).to(device=device, dtype=dtype) for _ in range(steps)]


def agree(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool(torch.isclose(a.float(), b.float(), **TOL[dtype]).all())


# ------------------------------------------------------------------------------------------------ the table
def test_table_rejects_a_malformed_version_range() -> None:
    with pytest.raises(ValueError, match="'<2.14' or '>=2.4,<2.14'"):
        KernelDefect(name="x", optimizer=torch.optim.SGD, torch_versions="2.14", upstream="", description="", remedy="foreach")


@pytest.mark.parametrize(
    ("version", "expected"), [("2.13.0+cpu", True), ("2.13.1", True), ("2.14.0a0+git1234", True), ("2.14.0", False), ("2.15.1+cu128", False)]
)
def test_version_range_of_the_16bit_entry(version: str, expected: bool) -> None:
    assert torch_affected(SGD_16BIT, version) is expected
    assert torch_affected(SGD_FIRST_STEP, version)  # no fixed release yet


def test_defects_apply_by_optimizer_fused_momentum_dtype_and_device() -> None:
    half = [fresh_param(8, torch.bfloat16)]
    old = "2.13.0"
    assert defects_for(torch.optim.SGD(half, lr=0.1, fused=True), old) == [SGD_16BIT]
    assert defects_for(torch.optim.SGD(half, lr=0.1, momentum=0.9, fused=True), old) == [SGD_16BIT, SGD_FIRST_STEP]
    assert defects_for(torch.optim.SGD(half, lr=0.1, momentum=0.9, foreach=True), old) == []
    assert defects_for(torch.optim.SGD([fresh_param(8, torch.float32)], lr=0.1, momentum=0.9, fused=True), old) == [SGD_FIRST_STEP]
    assert defects_for(torch.optim.Adam(half, lr=0.1, fused=True), old) == []
    # Only the 16-bit group of a mixed optimizer is switched; the engine then unscales for the whole optimizer.
    opt = torch.optim.SGD([{"params": half}, {"params": [fresh_param(8, torch.float32)]}], lr=0.1, fused=True)
    guard_optimizer(opt)
    assert [g["fused"] for g in opt.param_groups] == [not torch_affected(SGD_16BIT), True]
    assert opt._step_supports_amp_scaling is not torch_affected(SGD_16BIT)


def test_device_and_dtype_must_hold_for_the_same_parameter() -> None:
    # One group, a CPU fp32 parameter and a 16-bit one elsewhere ("meta" stands in for a GPU here): no CPU 16-bit
    # parameter, so the CPU SGD defect does not apply and the group keeps its fused kernel.
    elsewhere = nn.Parameter(torch.zeros(8, dtype=torch.bfloat16, device="meta"))
    opt = torch.optim.SGD([fresh_param(8, torch.float32), elsewhere], lr=0.1, fused=True)
    assert defects_for(opt, "2.13.0") == []
    opt = torch.optim.SGD([fresh_param(8, torch.bfloat16), elsewhere], lr=0.1, fused=True)
    assert defects_for(opt, "2.13.0") == [SGD_16BIT]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_cpu_16bit_guard_switches_only_cpu_parameters(device: torch.device, half_dtype: torch.dtype, momentum: float) -> None:
    """On CUDA the 16-bit fused SGD is right and fast: the guard must leave it fused, and it must match foreach."""
    n = 4099
    finals = []
    for kernel in ({"fused": True}, {"foreach": True}):
        p = fresh_param(n, half_dtype, device=device)
        opt = torch.optim.SGD([p], lr=0.1, momentum=momentum, **kernel)
        applied = guard_optimizer(opt)
        if kernel.get("fused"):
            switched = device.type == "cpu" and torch_affected(SGD_16BIT)
            assert (SGD_16BIT in applied) is switched
            assert opt.param_groups[0]["fused"] is (not switched)
            assert opt._step_supports_amp_scaling is (not switched)
        for g in grads(n, half_dtype, steps=2, device=device):
            p.grad = g
            opt.step()
        finals.append(p.detach())
    torch.testing.assert_close(finals[0], finals[1], **TOL[half_dtype])


def test_each_defect_is_logged_once_per_process(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kernel_guards, "_logged", set())
    caplog.set_level(logging.INFO, logger="ampkit")
    for _ in range(2):
        guard_optimizer(torch.optim.SGD([fresh_param(8, torch.float32)], lr=0.1, momentum=0.9, fused=True))
    records = [r for r in caplog.records if SGD_FIRST_STEP.name in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert SGD_FIRST_STEP.upstream in records[0].getMessage()


# ------------------------------------------------------------------------------------------------ raw torch, as the table claims
@requires(SGD_16BIT)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_raw_fused_sgd_on_cpu_16bit_is_wrong_at_vector_sizes(dtype: torch.dtype, momentum: float) -> None:
    """The defect itself: torch's fused CPU SGD against foreach on identical weights and gradients, no guard."""
    finals = []
    for kernel in ({"fused": True}, {"foreach": True}):
        p = fresh_param(4099, dtype)
        opt = torch.optim.SGD([p], lr=0.1, momentum=momentum, **kernel)
        for g in grads(4099, dtype, steps=2):
            p.grad = g
            opt.step()
        finals.append(p.detach())
    wrong = ~torch.isclose(finals[0].float(), finals[1].float(), **TOL[dtype])
    assert wrong.float().mean() > 0.5, f"fused SGD matches foreach on {dtype}: torch fixed it; bound {SGD_16BIT.name}'s range"


@requires(SGD_FIRST_STEP)
def test_raw_fused_sgd_momentum_applies_garbage_after_an_overflowed_first_step(device: torch.device) -> None:
    """The defect itself: found_inf on the first step creates unwritten momentum buffers that the next step reads.

    The table claims every device (the buffers are made in Python): on CUDA this checks that claim."""
    n = 1600
    g_inf, g_clean = torch.full((n,), float("inf"), device=device), grads(n, torch.float32, 1, device=device)[0]

    def run() -> torch.Tensor:
        p = fresh_param(n, torch.float32, device=device)
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=True)
        for g, found in ((g_inf, 1.0), (g_clean, 0.0)):  # as GradScaler and the engine hand them over
            p.grad = g.clone()
            opt.grad_scale, opt.found_inf = torch.ones((), device=device), torch.tensor(found, device=device)  # type: ignore[attr-defined]
            poison_free_memory(n, device=device)
            opt.step()
        return p.detach()

    p = fresh_param(n, torch.float32, device=device)
    twin = torch.optim.SGD([p], lr=0.1, momentum=0.9, foreach=True)
    p.grad = g_clean.clone()
    twin.step()  # the skipped step never reaches an unfused optimizer
    # Uninitialised memory may by chance hold the right values; three tries with a poisoned allocator.
    assert any(not torch.allclose(run(), p.detach()) for _ in range(3)), f"torch fixed it; bound {SGD_FIRST_STEP.name}'s range"


# ------------------------------------------------------------------------------------------------ every fused path via the engine
class Net(nn.Module):
    """A 40x40 layer and a 4099-element parameter: whole vector blocks and a scalar tail."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(40, 40)
        self.extra = nn.Parameter(torch.randn(4099).sign() * (1 + torch.rand(4099)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Every gradient is bounded away from 0 (x in [1, 2), |extra| >= 1 for the few steps run): squares of tiny
        # gradients would underflow 16-bit optimizer state (in foreach's 16-bit arithmetic, not in fused's fp32
        # one) and make correct twins differ for reasons of their own.
        return self.lin(x).float().sum() + self.extra.float().pow(2).sum() / 2


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, **k),
    "sgd-momentum": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, **k),
    "sgd-nesterov-wd": lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, **k),
    "adam": lambda ps, **k: torch.optim.Adam(ps, lr=0.01, eps=1e-4, **k),
    "adamw": lambda ps, **k: torch.optim.AdamW(ps, lr=0.01, eps=1e-4, weight_decay=0.1, **k),
    "adagrad": lambda ps, **k: torch.optim.Adagrad(ps, lr=0.1, eps=1e-4, **k),
}
# Loss-scaled engines, so the fused optimizer gets grad_scale and found_inf: fp32, fp16 and bf16 parameters.
PRECISIONS = {"16-mixed": torch.float32, "16-true": torch.float16, "bf16-true": torch.bfloat16}


def engine_run(
    precision: str, make: Callable[..., torch.optim.Optimizer], kernel: dict[str, bool], skip_first: bool, device: torch.device
) -> tuple[list[torch.Tensor], Engine]:
    model = Net().to(device)
    engine = Engine(precision, scaler=ScalerConfig(init_scale=2.0**8))  # 2**16 would overflow these fp16 gradients
    model, _opt = engine.setup(model, make(model.parameters(), **kernel))
    x = (1 + torch.rand(8, 40, generator=torch.Generator().manual_seed(2))).to(device)
    for i in range(3):
        with engine.autocast():
            loss = model(x.to(PRECISIONS[precision]))
        engine.backward(loss * float("inf") if skip_first and i == 0 else loss)
        poison_free_memory(1600, 40, 4099, device=device)
        engine.step()
    return [p.detach().clone() for p in model.parameters()], engine


def fused_kernel_missing(make: Callable[..., torch.optim.Optimizer], device: torch.device) -> str | None:
    """Why torch has no fused kernel for this optimizer on ``device`` (found by trying one step), or None."""
    p = nn.Parameter(torch.zeros(4, device=device))
    p.grad = torch.ones(4, device=device)
    try:
        make([p], fused=True).step()
    except (RuntimeError, NotImplementedError) as error:  # e.g. Adagrad's fused kernel is CPU-only
        return str(error).splitlines()[0]
    return None


@pytest.mark.parametrize("skip_first", [False, True], ids=["clean-first-step", "skipped-first-step"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_fused_engine_path_matches_its_plain_twin(device: torch.device, name: str, precision: str, skip_first: bool) -> None:
    if name == "adagrad" and PRECISIONS[precision] != torch.float32:
        pytest.skip("torch's Adagrad allocates its state at construction, in fp32, before the engine casts the model; its fused kernel refuses the mix")
    if device.type != "cpu" and (missing := fused_kernel_missing(OPTIMIZERS[name], device)):
        pytest.skip(f"torch {torch.__version__} has no fused {name} on {device.type}: {missing}")
    fused, engine = engine_run(precision, OPTIMIZERS[name], {"fused": True}, skip_first, device)
    plain, twin = engine_run(precision, OPTIMIZERS[name], {"foreach": True}, skip_first, device)
    assert engine.skipped_steps == twin.skipped_steps == int(skip_first)
    dtype = PRECISIONS[precision]
    for a, b in zip(fused, plain, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **TOL[dtype])


def test_the_engine_steps_a_first_step_pending_optimizer_on_the_host_only_until_its_first_real_step(device: torch.device) -> None:
    model = Net().to(device)
    engine = Engine("16-mixed")
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True))
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(3)).to(device)
    pending = []
    for i in range(3):
        pending.append(first_step_pending(opt))
        engine.backward(model(x) * (float("inf") if i < 2 else 1.0))
        engine.step()
    assert pending == [True, True, True] and not first_step_pending(opt)
    assert opt.param_groups[0]["fused"] and opt._step_supports_amp_scaling  # still the fused kernel after that
