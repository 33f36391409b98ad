"""bf16-true-kahan and bf16-true-sr train a model whose updates bf16-true loses, and resume bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine

pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")

POLICIES = ["bf16-true-kahan", "bf16-true-sr"]
# How far from the fp32 control's final loss each may end, as a share of the control's progress. Kahan is
# deterministic: 2% here, of the order of the bf16 grid's own error (see _problem). Stochastic rounding adds
# zero-mean noise: over 12 seeds its error had a standard deviation of 8% of the progress; 25% is about 3 of them.
TOLERANCE = {"bf16-true-kahan": 0.05, "bf16-true-sr": 0.25}
STEPS = 60


def _needs(policy: str) -> None:
    if policy == "bf16-true-sr":
        pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")


def _problem() -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """Weights near 1.5 that AdamW at lr 1e-3 moves by about 1e-3 a step: a quarter of half a bf16 ulp there (2**-8),
    so bf16-true rounds every update away. Over the run they move some 8 ulps, so the bf16 grid itself (half an
    ulp of error per weight) costs the loss about 1% of the run's progress."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Linear(16, 1, bias=False)  # one weight shape: torchao compiles its step per shape
    with torch.no_grad():
        model.weight.copy_(1.5 + 0.05 * torch.randn(1, 16, generator=gen))
    x = torch.randn(64, 16, generator=gen)
    y = x @ (model.weight.detach() - 0.2).T  # the optimum lies 0.2 away: every step of the run heads there
    return model, x, y


def _train(policy: str, steps: int = STEPS) -> tuple[float, float, torch.Tensor]:
    """Start and final loss (in fp32, of the trained weights), and those weights."""
    model, x, y = _problem()
    start = nn.functional.mse_loss(x @ model.weight.detach().T, y).item()
    torch.manual_seed(0)  # seeds stochastic rounding's stream: the same draws whatever ran before
    engine = Engine(policy)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0))
    for _ in range(steps):
        engine.backward(nn.functional.mse_loss(model(x), y))
        engine.step()
    weight = model.weight.detach().float()
    return start, nn.functional.mse_loss(x @ weight.T, y).item(), weight


def test_bf16_true_loses_every_update_of_this_model() -> None:
    model, _, _ = _problem()
    start = model.weight.detach().bfloat16().float()
    assert torch.equal(_train("bf16-true")[2], start)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_policy_tracks_the_fp32_control(policy: str) -> None:
    _needs(policy)
    start, control, _ = _train("32-true")
    _, treated, _ = _train(policy)
    _, lost, _ = _train("bf16-true")
    progress = start - control
    assert progress > 0
    assert abs(treated - control) < TOLERANCE[policy] * progress
    assert abs(lost - control) > 0.9 * progress


@pytest.mark.parametrize("policy", POLICIES)
def test_resume_is_bitwise(policy: str, tmp_path: Path) -> None:
    _needs(policy)
    model, x, y = _problem()
    engine = Engine(policy)
    model, opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def train(e: Engine, m: nn.Module, steps: int) -> torch.Tensor:
        for _ in range(steps):
            e.backward(nn.functional.mse_loss(m(x), y))
            e.step()
        return m.weight.detach().clone()

    train(engine, model, 3)
    engine.save(tmp_path / "ckpt.pt")
    control = train(engine, model, 5)

    other, _, _ = _problem()
    with torch.no_grad():
        other.weight.add_(1.0)  # different weights: the checkpoint must bring them back
    resumed = Engine(policy)
    other, other_opt = resumed.setup(other, torch.optim.AdamW(other.parameters(), lr=1e-3))
    torch.manual_seed(1234)  # a different random stream: stochastic rounding must continue the saved one
    resumed.load(tmp_path / "ckpt.pt")
    assert torch.equal(train(resumed, other, 5).view(torch.int16), control.view(torch.int16))
    state, other_state = opt.state_dict()["state"], other_opt.state_dict()["state"]
    for key, value in state[0].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(other_state[0][key], value), key
