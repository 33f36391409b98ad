"""The library twins of torch optimizers: each mapping proven against the torch optimizer, each refusal naming its fix."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.policy import _lowbit_optimizers as lowbit_optimizers
from ampkit.policy._lowbit_optimizers import lowbit_twin

optimi = pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")

Build = Callable[[list[dict]], torch.optim.Optimizer]

# Two groups with their own settings, so a mapping that read only the defaults fails.
KAHAN_KINDS: dict[str, Build] = {
    "adam-l2": lambda g: torch.optim.Adam(g, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    "adamw": lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.85, 0.99), eps=1e-7, weight_decay=0.2),
    "sgd-momentum-l2": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.01),
    "sgd": lambda g: torch.optim.SGD(g, lr=0.05),
}


def _params(shapes: tuple[tuple[int, ...], ...] = ((4, 3), (4,))) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(*s, generator=gen) + 1.0) for s in shapes]


def _groups(params: list[nn.Parameter]) -> list[dict]:
    # The second group overrides lr and weight decay (and momentum, which only SGD reads).
    return [{"params": params[:1]}, {"params": params[1:], "lr": 3e-3, "weight_decay": 0.0}]


def _run_both(build: Build, method: str, steps: int = 5, shapes: tuple[tuple[int, ...], ...] = ((4, 3), (4,))) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The same fp32 parameters stepped by the torch optimizer and by its twin, on the same gradients."""
    ref, mine = _params(shapes), _params(shapes)
    ref_opt, twin = build(_groups(ref)), lowbit_twin(build(_groups(mine)), method)  # type: ignore[arg-type]
    assert type(twin).__module__.split(".")[0] in ("optimi", "torchao")
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for a, b in zip(ref, mine):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()  # optimi uses the gradient as scratch space
        ref_opt.step()
        twin.step()
    return ref, mine


@pytest.mark.parametrize("kind", list(KAHAN_KINDS))
def test_the_kahan_twin_steps_fp32_weights_as_the_torch_optimizer_does(kind: str) -> None:
    ref, mine = _run_both(KAHAN_KINDS[kind], "kahan")
    for a, b, start in zip(ref, mine, _params()):
        assert not torch.equal(a, start)  # it trained
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["adamw", "adam-l2"])
def test_the_sr_twin_steps_fp32_weights_as_the_torch_optimizer_does(kind: str) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    # One shape: torchao compiles its step per parameter shape (seconds each on the CPU).
    ref, mine = _run_both(KAHAN_KINDS[kind], "sr", steps=3, shapes=((4, 3), (4, 3)))
    for a, b in zip(ref, mine):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_on_the_cpu_the_kahan_twin_decays_bf16_weights_by_the_fp32_factor() -> None:
    # optimi's foreach path multiplies by the decay factor (1 - lr * wd) and by beta2 through torch._foreach_mul_,
    # which on the CPU rounds the scalar to the tensors' dtype (torch 2.13): 0.99 becomes 0.98828125 for bf16 weights.
    # The twin runs optimi's for-loop there, whose per-tensor mul_ keeps the factor in fp32, as the Triton kernel does.
    weights = torch.tensor([1.5, -2.25, 3.0, 0.7], dtype=torch.bfloat16)
    param = nn.Parameter(weights.clone())
    twin = lowbit_twin(torch.optim.AdamW([param], lr=0.1, weight_decay=0.1), "kahan")
    assert twin.param_groups[0]["foreach"] is False
    param.grad = torch.zeros_like(param)  # no Adam update: the step is the decay alone
    twin.step()
    assert torch.equal(param.detach(), (weights.float() * (1 - 0.1 * 0.1)).bfloat16())


def test_settings_of_each_group_are_carried_over() -> None:
    twin = lowbit_twin(KAHAN_KINDS["adamw"](_groups(_params())), "kahan")
    first, second = twin.param_groups
    assert (first["lr"], first["beta1"], first["beta2"], first["eps"], first["weight_decay"]) == (1e-2, 0.85, 0.99, 1e-7, 0.2)
    assert (second["lr"], second["weight_decay"], second["decouple_wd"], second["kahan_sum"]) == (3e-3, 0.0, True, True)


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "build, method, match",
    [
        (lambda p: torch.optim.AdamW(p, amsgrad=True), "kahan", "Drop amsgrad=True"),
        (lambda p: torch.optim.Adam(p, maximize=True), "sr", "Drop maximize=True"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "kahan", "Drop nesterov=True"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5), "kahan", "Use dampening=0"),
        (lambda p: torch.optim.SGD(p, lr=0.1), "sr", "Train SGD with 'bf16-true-kahan' or 'bf16-true-remainder'"),
    ],
)
def test_settings_without_an_exact_equivalent_are_refused(build: Callable, method: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        lowbit_twin(build(_params()), method)  # type: ignore[arg-type]


def test_other_optimizers_are_refused_naming_the_policy_that_steps_them() -> None:
    with pytest.raises(TypeError, match="got RMSprop.*'bf16-true-remainder'"):
        lowbit_twin(torch.optim.RMSprop(_params()), "kahan")


def test_an_optimizer_that_has_stepped_is_refused() -> None:
    params = _params()
    opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    with pytest.raises(ValueError, match="has already stepped.*load your checkpoint after setup"):
        lowbit_twin(opt, "kahan")


def test_a_scheduler_on_the_replaced_optimizer_is_refused_at_setup() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    with pytest.raises(ValueError, match="build the scheduler on the optimizer setup\\(\\) returns"):
        Engine("bf16-true-kahan").setup(model, opt, schedulers=sched)
    assert model.weight.dtype == torch.float32  # refused before the policy cast anything


def test_a_scheduler_built_on_the_returned_twin_schedules_it() -> None:
    model = nn.Linear(3, 2)
    engine = Engine("bf16-true-kahan")
    model, opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1.0))
    assert isinstance(opt, optimi.Adam) and engine.optimizers == [opt]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    engine.backward(model(torch.ones(2, 3)).float().sum())
    engine.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.5


def test_a_library_optimizer_with_the_feature_on_is_kept_and_off_is_refused() -> None:
    params = _params()
    on = optimi.AdamW(params, lr=1e-3, kahan_sum=True)
    assert lowbit_twin(on, "kahan") is on
    with pytest.raises(ValueError, match="Kahan summation off; build it with kahan_sum=True"):
        lowbit_twin(optimi.AdamW(params, lr=1e-3, kahan_sum=False), "kahan")


def test_a_torchao_optimizer_without_stochastic_rounding_is_refused() -> None:
    ao = pytest.importorskip("torchao.optim", reason="Requires: torchao (pip install -e '.[lowbit]')")
    params = _params()
    on = ao._AdamW(params, bf16_stochastic_round=True)
    assert lowbit_twin(on, "sr") is on
    with pytest.raises(ValueError, match="build it with bf16_stochastic_round=True"):
        lowbit_twin(ao._AdamW(params), "sr")


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def absent(name: str, *args: object) -> object:
        if name.startswith(("optimi", "torchao")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(lowbit_optimizers.importlib, "import_module", absent)
    with pytest.raises(ImportError, match=r"pip install 'ampkit\[lowbit\]'"):
        lowbit_twin(torch.optim.AdamW(_params()), "kahan")


def test_torchao_import_noise_is_dropped_and_other_lines_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with lowbit_optimizers.quiet_library_logs("torchao", "torchao.kernel.intmm"):
        logging.getLogger("torchao").warning("Failed to load /x/_C_cutlass_90a.abi3.so: Could not load this library")
        logging.getLogger("torchao.kernel.intmm").warning("Warning: Detected no triton, on systems without Triton certain kernels will not work")
        logging.getLogger("torchao").warning("something else")
    logging.getLogger("torchao").warning("Failed to load after the import")
    assert [r.getMessage() for r in caplog.records] == ["something else", "Failed to load after the import"]


def test_without_the_library_the_policy_does_not_run_and_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import ampkit

    assert ampkit.get_policy("bf16-true-kahan").support("cpu").supported
    monkeypatch.setattr(lowbit_optimizers.importlib.util, "find_spec", lambda name, *a: None)
    support = ampkit.get_policy("bf16-true-kahan").support("cpu")
    assert not support.supported and "pip install 'ampkit[lowbit]'" in support.reason
