"""bf16-true-sr's step as one compiled region, against its plain twin: torchao's own ``_AdamW.step``.

Stochastic rounding draws random bits, so the twins are compared where the bits are the same: with inductor's
``fallback_random`` both draw them from torch's generator through aten, in parameter order, and then the region
must reproduce torchao's step bit for bit (weights and every state tensor). With the region's default bits the
checks are that the same seed gives the same run, that a skipped step draws nothing, and that a checkpoint resumes
the random stream exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.training._fused_library_step import FusedLibraryStep, build_library_step

ao = pytest.importorskip("torchao.optim", reason="Requires: torchao (pip install -e '.[lowbit]')")

SHAPES = ((24, 16), (16,), (8, 24), (24, 16))  # a repeated shape, a 1-d one, and (index 1) an fp32 parameter
SAME_BITS = {"options": {"fallback_random": True}}  # the region draws its bits with aten, as the patched twin does


def _params(device: torch.device) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    # Values near 1 with updates far below half a bf16 ulp: only stochastic rounding moves them, so a wrong draw shows.
    return [nn.Parameter((1.0 + 0.1 * torch.randn(s, generator=gen)).to(device, torch.float32 if i == 1 else torch.bfloat16)) for i, s in enumerate(SHAPES)]


def _optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    # Two groups with their own lr, decay and amsgrad, so a region that read only the first group's settings fails.
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 3e-3, "weight_decay": 0.0, "amsgrad": True}]
    return ao._AdamW(groups, lr=1e-3, weight_decay=0.1, bf16_stochastic_round=True)


def _grads(step: int, device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=gen).to(device) for s in SHAPES]


def _train(stepper: Any, params: list[nn.Parameter], opt: torch.optim.Optimizer, device: torch.device, steps: int = 5, late: bool = False) -> None:
    torch.manual_seed(7)
    for i in range(steps):
        for j, (p, g) in enumerate(zip(params, _grads(i, device))):
            p.grad = None if late and j == 3 and i < 2 else g.to(p.dtype)  # late: the last parameter's first gradient at step 3
        stepper(opt)
        if i == 2:  # a scheduler's change: torchao's lr is a 0-d tensor, filled in place
            for g in opt.param_groups:
                g["lr"].fill_(float(g["lr"]) * 0.5)


def _torchaos_own(opt: torch.optim.Optimizer) -> None:
    # The region's first step is torchao's step run eagerly; the twin's is the same, so that all later steps compare.
    if opt.state:
        opt.step()
        return
    with torch.compiler.set_stance("force_eager"):
        opt.step()


def _assert_same(a: list[nn.Parameter], opt_a: torch.optim.Optimizer, b: list[nn.Parameter], opt_b: torch.optim.Optimizer) -> None:
    for x, y in zip(a, b):
        assert torch.equal(x, y)
        assert opt_a.state[x].keys() == opt_b.state[y].keys()
        for key, value in opt_a.state[x].items():
            assert torch.equal(value, opt_b.state[y][key]), key


@pytest.mark.parametrize("late", [False, True], ids=["all", "late-parameter"])
def test_the_region_steps_bit_for_bit_as_torchaos_own_step_given_the_same_bits(device: torch.device, late: bool) -> None:
    ref, mine = _params(device), _params(device)
    ref_opt, my_opt = _optimizer(ref), _optimizer(mine)
    with torch._inductor.config.patch(fallback_random=True):
        _train(_torchaos_own, ref, ref_opt, device, late=late)
    region = FusedLibraryStep(SAME_BITS)
    _train(region.step, mine, my_opt, device, late=late)
    assert region.calls == 4 and region.failed is None  # the first step built the state, unfused
    start = _params(device)
    assert not torch.equal(mine[0], start[0]) and not torch.equal(mine[1], start[1])  # bf16 and fp32 weights moved
    _assert_same(ref, ref_opt, mine, my_opt)


class _Counting:
    """A torch.compile backend that runs the graph as traced and counts the compilations."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        self.graphs += 1
        return gm.forward


def test_one_compilation_serves_every_step_across_learning_rate_changes_and_a_reload(device: torch.device) -> None:
    counting = _Counting()
    params = _params(device)
    opt = _optimizer(params)
    region = FusedLibraryStep({"backend": counting})
    _train(region.step, params, opt, device)
    opt.load_state_dict(opt.state_dict())  # a checkpoint load: new state tensors of the same kind
    _train(region.step, params, opt, device, steps=2)
    assert counting.graphs == 1 and region.calls == 4 + 2


def test_a_region_that_fails_to_compile_warns_once_and_torchao_steps_instead(device: torch.device) -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError("no compiler here")

    ref, mine = _params(device), _params(device)
    ref_opt, my_opt = _optimizer(ref), _optimizer(mine)
    _train(_torchaos_own, ref, ref_opt, device)
    region = FusedLibraryStep({"backend": broken})
    with pytest.warns(UserWarning, match="failed to compile") as caught:
        _train(region.step, mine, my_opt, device)
    messages = [str(w.message) for w in caught if "failed to compile" in str(w.message)]
    assert len(messages) == 1 and "no compiler here" in messages[0] and "fused_step=False" in messages[0]
    assert region.calls == 0 and "no compiler here" in str(region.failed)
    _assert_same(ref, ref_opt, mine, my_opt)  # every step was torchao's own, random bits included


# ------------------------------------------------------------------------------------------------------ the engine
def _model(device: torch.device) -> nn.Linear:
    torch.manual_seed(0)
    model = nn.Linear(16, 8).to(device)
    with torch.no_grad():
        model.weight.add_(1.5)  # far from 0: AdamW's ~1e-3 steps are below half a bf16 ulp, only rounding moves them
    return model


def _engine_run(device: torch.device, steps: int, *, fused_step: Any = None, inf_at: int | None = None, seed: int = 0) -> tuple[Engine, nn.Module, torch.optim.Optimizer, list[bool]]:
    model = _model(device)
    engine = Engine("bf16-true-sr", skip_nonfinite=inf_at is not None, fused_step=fused_step)
    model, opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    skipped = _steps(engine, model, device, range(steps), inf_at, seed)
    return engine, model, opt, skipped


def _steps(engine: Engine, model: nn.Module, device: torch.device, steps: range, inf_at: int | None = None, seed: int | None = 0) -> list[bool]:
    skipped = []
    for i in steps:
        gen = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(32, 16, generator=gen).to(device, torch.bfloat16)
        loss = model(x).float().square().mean()
        if i == inf_at:
            loss = loss * float("inf")
        if i == steps.start and seed is not None:
            torch.manual_seed(seed)  # the stream the rounding draws from, set after the model's start
        engine.backward(loss)
        engine.step()
        skipped.append(engine.step_was_skipped)
    return skipped


def test_bf16_true_sr_steps_through_the_region_by_default_and_fused_step_false_keeps_torchaos(device: torch.device) -> None:
    engine, _, _, _ = _engine_run(device, 3)
    assert isinstance(engine.library_step, FusedLibraryStep) and engine.library_step.calls == 2 and engine.fused_step is None
    plain, _, _, _ = _engine_run(device, 3, fused_step=False)
    assert plain.library_step is None


def test_the_same_seed_gives_the_same_run_and_another_seed_another(device: torch.device) -> None:
    _, a, _, _ = _engine_run(device, 6)
    _, b, _, _ = _engine_run(device, 6)
    _, c, _, _ = _engine_run(device, 6, seed=1)
    assert torch.equal(a.weight, b.weight)
    assert not torch.equal(a.weight, c.weight)  # the rounding depends on the bits drawn: the region draws them
    assert not torch.equal(a.weight, _model(device).weight.to(torch.bfloat16))  # and they moved the weights


def test_a_skipped_step_changes_nothing_and_draws_no_bits(device: torch.device) -> None:
    engine, model, opt, skipped = _engine_run(device, 5, inf_at=2)
    assert skipped == [False, False, True, False, False] and engine.library_step is not None and engine.library_step.calls == 3
    # The control takes the same four clean steps (the same batches) and never sees the bad one.
    control = Engine("bf16-true-sr", skip_nonfinite=True)
    start = _model(device)
    c_model, c_opt = control.setup(start, torch.optim.AdamW(start.parameters(), lr=1e-3))
    torch.manual_seed(0)
    for i in (0, 1, 3, 4):
        gen = torch.Generator().manual_seed(1000 + i)
        control.backward(c_model(torch.randn(32, 16, generator=gen).to(device, torch.bfloat16)).float().square().mean())
        control.step()
    assert torch.equal(model.weight, c_model.weight) and torch.equal(model.bias, c_model.bias)
    for p, q in zip(model.parameters(), c_model.parameters()):
        for key, value in opt.state[p].items():
            assert torch.equal(value, c_opt.state[q][key]), key


def test_a_checkpoint_resumes_the_compiled_step_bit_for_bit(device: torch.device, tmp_path: Path) -> None:
    engine, model, _opt, _ = _engine_run(device, 3)
    engine.save(tmp_path / "ckpt.pt")
    _steps(engine, model, device, range(3, 7), seed=None)
    resumed = Engine("bf16-true-sr")
    other = nn.Linear(16, 8).to(device)  # other weights: the checkpoint brings them back
    other, _ = resumed.setup(other, torch.optim.AdamW(other.parameters(), lr=1e-3))
    torch.manual_seed(1234)  # another stream: the checkpoint must bring the saved one back
    resumed.load(tmp_path / "ckpt.pt")
    _steps(resumed, other, device, range(3, 7), seed=None)
    assert resumed.library_step is not None and resumed.library_step.calls == 4  # loaded state: no unfused first step
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)


def test_insisting_on_a_compiled_step_that_has_nothing_to_compile_is_refused() -> None:
    pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="optimi runs its own fused kernels.*use fused_step=False"):
        Engine("bf16-true-kahan", fused_step=True).setup(model, torch.optim.AdamW(model.parameters()))
    opt = ao._AdamW(model.parameters(), bf16_stochastic_round=True)
    opt.register_step_post_hook(lambda *args: None)
    with pytest.raises(ValueError, match="step hooks.*fused_step=False"):
        Engine("bf16-true-sr", fused_step=True).setup(model, opt)
    assert build_library_step(None, None, [opt]) is None  # by default: torchao's own step, which runs the hooks
