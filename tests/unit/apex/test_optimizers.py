"""apex.optimizers on torch's optimizers: each step equals torch's own optimizer on identical weights and grads.

The parity tests are device-generic: on CUDA the fused kernels are CUDA's, compared with torch's default there."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from ampkit.apex import optimizers as apex_optim
from ampkit.apex.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD


def _params(seed: int = 0, device: torch.device | str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU: every device sees the same values
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g).to(device)), torch.nn.Parameter(torch.randn(3, generator=g).to(device))]


def _run(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], steps: int = 3, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Step an optimizer from fixed weights on a fixed gradient sequence; return the final weights."""
    params = _params(device=device)
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        opt.step()
    return [p.detach().clone() for p in params]


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------ FusedAdam
def test_fused_adam_w_mode_equals_adamw(device):
    got = _run(lambda ps: FusedAdam(ps, lr=0.01, weight_decay=0.1), device=device)
    _assert_same(got, _run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), device=device))
    # Different from L2 Adam, so the comparison above is not vacuous.
    assert not torch.allclose(got[0], _run(lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1), device=device)[0])


def test_fused_adam_l2_mode_equals_adam(device):
    got = _run(lambda ps: FusedAdam(ps, lr=0.01, weight_decay=0.1, adam_w_mode=False, betas=(0.8, 0.99), eps=1e-6), device=device)
    _assert_same(got, _run(lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6), device=device))


def test_fused_adam_amsgrad_runs_torchs():
    got = _run(lambda ps: FusedAdam(ps, lr=0.01, amsgrad=True))
    _assert_same(got, _run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.0, amsgrad=True)))


def test_fused_adam_is_torch_adam_on_the_fused_kernel(device):
    opt = FusedAdam(_params(device=device))
    assert isinstance(opt, torch.optim.Adam)
    assert opt.defaults["fused"] is True and opt._step_supports_amp_scaling


def test_param_groups_generators_and_named_params_are_accepted():
    a, b = _params()
    opt = FusedAdam(p for p in [{"params": iter([a]), "lr": 0.5}, {"params": b}])
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1] and opt.param_groups[0]["lr"] == 0.5
    named = FusedSGD(torch.nn.Linear(2, 2).named_parameters(), lr=0.1)
    assert named.defaults["fused"] is True


def test_no_fused_kernel_falls_back_to_foreach(monkeypatch: pytest.MonkeyPatch):
    complex_param = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    assert FusedAdam([complex_param]).defaults["foreach"] is True
    monkeypatch.setattr(apex_optim, "_fused_runs", lambda *a: False)
    opt = FusedSGD(_params(), lr=0.1)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    _assert_same(_run(lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9)), _run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)))


def test_fused_adam_capturable_is_harmless_on_cpu():
    opt = FusedAdam(_params(), capturable=True)
    assert opt.defaults["capturable"] is False
    _assert_same(_run(lambda ps: FusedAdam(ps, capturable=True)), _run(lambda ps: torch.optim.AdamW(ps, weight_decay=0.0)))


def test_fused_adam_refuses_bias_correction_off():
    with pytest.raises(NotImplementedError, match=r"bias_correction=False\) has no torch equivalent.*Drop bias_correction=False"):
        FusedAdam(_params(), bias_correction=False)
    with pytest.raises(NotImplementedError, match="bias_correction"):
        FusedAdam([{"params": _params(), "bias_correction": False}])


def test_fused_adam_refuses_master_weights():
    with pytest.raises(NotImplementedError, match=r"master_weights=True.*opt_level='O2'"):
        FusedAdam(_params(), master_weights=True)


def test_set_grad_none_decides_bare_zero_grad():
    params = _params()
    adam, sgd = FusedAdam(params), FusedSGD(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    sgd.zero_grad()  # Apex's FusedSGD default: zero-filled
    assert all(p.grad is not None and not p.grad.any() for p in params)
    adam.zero_grad()
    assert all(p.grad is None for p in params)
    for p in params:
        p.grad = torch.ones_like(p)
    FusedAdam(params, set_grad_none=False).zero_grad()
    assert all(p.grad is not None for p in params)
    adam.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params)


def test_fused_adam_resumes_an_apex_state_dict(device):
    """Apex kept one step count per group; its checkpoints load and the next step equals torch's (on CUDA the fused
    kernel needs the step counts on the parameters' device: torch's loading puts the converted ones there)."""
    control = FusedAdam(_params(device=device), lr=0.01, weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        for p in control.param_groups[0]["params"]:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        control.step()
    sd = control.state_dict()
    apex_sd = copy.deepcopy(sd)
    for state in apex_sd["state"].values():
        del state["step"]
    apex_sd["param_groups"][0].update(step=2, bias_correction=True)
    before = copy.deepcopy(apex_sd)

    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in control.param_groups[0]["params"]]
    resumed = FusedAdam(resumed_params, lr=0.01, weight_decay=0.1)
    resumed.load_state_dict(apex_sd)
    assert apex_sd["param_groups"] == before["param_groups"] and "step" not in apex_sd["state"][0]  # caller's dict kept
    for opt in (control, resumed):
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        opt.step()
    _assert_same([p.detach() for p in resumed_params], [p.detach() for p in control.param_groups[0]["params"]])
    assert float(resumed.state[resumed_params[0]]["step"]) == 3.0


def test_fused_adam_under_amp_o2_trains():
    from ampkit.apex import amp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model, opt = amp.initialize(model, FusedAdam(model.parameters(), lr=1e-2), opt_level="O2", verbosity=0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------------------------------------- FusedSGD
@pytest.mark.parametrize("kwargs", [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, {"momentum": 0.5, "dampening": 0.2}])
def test_fused_sgd_equals_sgd(kwargs: dict, device):
    _assert_same(_run(lambda ps: FusedSGD(ps, lr=0.1, **kwargs), device=device), _run(lambda ps: torch.optim.SGD(ps, lr=0.1, **kwargs), device=device))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fused_sgd_on_16bit_params_equals_sgd_at_vector_sizes(dtype: torch.dtype, momentum: float):
    """4099 elements reach the vectorised code, where torch's fused CPU SGD is wrong for 16-bit parameters (kernel_guards)."""

    def run(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]) -> torch.Tensor:
        p = torch.nn.Parameter(torch.randn(4099, generator=torch.Generator().manual_seed(0)).to(dtype))
        opt, g = make([p]), torch.Generator().manual_seed(1)
        for _ in range(3):
            p.grad = torch.randn(4099, generator=g).to(dtype)
            opt.step()
        return p.detach()

    got = run(lambda ps: FusedSGD(ps, lr=0.1, momentum=momentum))
    torch.testing.assert_close(got, run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=momentum, foreach=True)))


def _learn(dtype: torch.dtype, amp_o3: bool) -> float:
    """Accuracy after training a small MLP on a separable 4-class task: a pure 16-bit loop, or amp O3 with FusedSGD."""
    from ampkit.apex import amp

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if amp_o3:
        model, opt = amp.initialize(model, FusedSGD(model.parameters(), lr=0.1, momentum=0.9), opt_level="O3", half_dtype=dtype, verbosity=0)
    else:
        model = model.to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # torch's default (foreach) kernel
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y)
        opt.zero_grad()
        if amp_o3:
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
        else:
            loss.backward()
        opt.step()
    with torch.no_grad():
        return (model(x.to(dtype)).argmax(1) == y).float().mean().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amp_o3_with_fused_sgd_learns_as_a_pure_16bit_loop_does(dtype: torch.dtype):
    control = _learn(dtype, amp_o3=False)
    assert control > 0.9  # the task is learnable in pure 16 bits
    assert _learn(dtype, amp_o3=True) >= control - 0.05


def test_fused_sgd_is_torch_sgd_and_accepts_apex_only_knobs():
    opt = FusedSGD(_params(), lr=0.1, materialize_master_grads=False, set_grad_none=True)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["fused"] is True


def test_fused_sgd_refuses_wd_after_momentum():
    with pytest.raises(NotImplementedError, match=r"wd_after_momentum=True.*Drop wd_after_momentum=True"):
        FusedSGD(_params(), lr=0.1, wd_after_momentum=True)


def test_fused_sgd_needs_lr_like_apex():
    with pytest.raises(TypeError, match=r"FusedSGD needs a learning rate: pass lr="):
        FusedSGD(_params())
    a, b = _params()
    opt = FusedSGD([{"params": [a], "lr": 0.1}])  # lr per group is enough
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [b]})


# --------------------------------------------------------------------------------------------- FusedAdagrad
def test_fused_adagrad_equals_adagrad(device):
    got = _run(lambda ps: FusedAdagrad(ps, lr=0.1, weight_decay=0.01, eps=1e-8), device=device)
    _assert_same(got, _run(lambda ps: torch.optim.Adagrad(ps, lr=0.1, weight_decay=0.01, eps=1e-8), device=device))
    assert isinstance(FusedAdagrad(_params()), torch.optim.Adagrad)


def test_fused_adagrad_refuses_w_mode():
    with pytest.raises(NotImplementedError, match=r"adagrad_w_mode=True.*Drop adagrad_w_mode=True"):
        FusedAdagrad(_params(), adagrad_w_mode=True)


def test_fused_adagrad_resumes_an_apex_state_dict():
    control = FusedAdagrad(_params(), lr=0.1)
    for p in control.param_groups[0]["params"]:
        p.grad = torch.full_like(p, 0.5)
    control.step()
    apex_sd = copy.deepcopy(control.state_dict())
    for state in apex_sd["state"].values():
        del state["step"]  # Apex kept only the sums
    params = [torch.nn.Parameter(p.detach().clone()) for p in control.param_groups[0]["params"]]
    resumed = FusedAdagrad(params, lr=0.1)
    resumed.load_state_dict(apex_sd)
    for opt in (control, resumed):
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        opt.step()
    _assert_same([p.detach() for p in params], [p.detach() for p in control.param_groups[0]["params"]])


# ------------------------------------------------------------------------------------- no torch counterpart
@pytest.mark.parametrize("cls", [FusedLAMB, FusedMixedPrecisionLamb])
def test_lamb_raises_naming_alternatives(cls: type):
    with pytest.raises(NotImplementedError, match=r"no native LAMB.*torch.optim.AdamW.*LARC.*real NVIDIA Apex"):
        cls(_params(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)


def test_novograd_raises_naming_alternatives():
    with pytest.raises(NotImplementedError, match=r"no native NovoGrad.*torch.optim.AdamW.*real NVIDIA Apex"):
        FusedNovoGrad(_params())
