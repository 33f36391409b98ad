"""Small trained runs for the checkpoint modules' own tests: one tiny model, AdamW, a StepLR, a few micro-batches."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from ampkit import Engine


def _train(precision: str = "32-true", *, seed: int = 0, accumulate: int = 1, micro_batches: int = 2, width: int = 4) -> Engine:
    """An engine set up on a fresh model (weights from ``seed``) that ran ``micro_batches`` backward passes."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    engine = Engine(precision, accumulate=accumulate)
    engine.setup(model, opt, schedulers=sched)
    g = torch.Generator().manual_seed(seed)
    for _ in range(micro_batches):
        with engine.autocast():
            loss = engine.models[0](torch.randn(4, 3, generator=g)).float().square().mean()
        engine.backward(loss)
        engine.step()
    return engine


def _tensors(engine: Engine) -> list[torch.Tensor]:
    """Copies of every tensor a checkpoint restores into the model and optimizer, in a fixed order."""
    model, opt = engine.models[0], engine.optimizers[0]
    return [t.detach().clone() for t in model.state_dict().values()] + [
        v.clone() for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    ]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def trained() -> Callable[..., Engine]:
    return _train


@pytest.fixture
def tensors() -> Callable[[Engine], list[torch.Tensor]]:
    return _tensors


@pytest.fixture
def same() -> Callable[[list[torch.Tensor], list[torch.Tensor]], bool]:
    return _same

