"""Shared pieces of the Lightning tests: a small LightningModule, its data, the Trainer settings that keep a run quiet,
and the ampkit Engine loop that is every plugin run's control (same weights, same batches, the same policy)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ampkit

pytest.importorskip("lightning", reason="ampkit.lightning needs lightning (pip install 'ampkit[lightning]')")

import lightning as L

INF = float("inf")
BATCH, ROWS, FEATURES, CLASSES = 8, 64, 16, 4
QUIET = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, CLASSES))


def data(rows: int = ROWS, seed: int = 1) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(rows, FEATURES, generator=g), torch.randint(0, CLASSES, (rows,), generator=g))


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.float(), y)


class Classifier(L.LightningModule):
    """A LightningModule as users write one: training_step returns the loss; it records each loss and, on request,
    puts an inf into one gradient at given optimizer steps (an fp16 overflow) and keeps what hooks saw."""

    def __init__(self, optimizer: Callable[[Any], torch.optim.Optimizer] | None = None, poison: set[int] = frozenset()) -> None:
        super().__init__()
        self.net = net()
        self.make_optimizer = optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-2))
        self.poison = set(poison)
        self.losses: list[float] = []
        self.hook_grads: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = loss_of(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def on_after_backward(self) -> None:
        if self.global_step in self.poison:
            self.net[0].weight.grad[0, 0] = INF

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # What clipping and gradient-norm logging read: the parameters the optimizer steps (fp32 masters where the
        # policy has them; the model's own parameters otherwise).
        stepped = optimizer.param_groups[0]["params"][-1]  # the head's bias, as the optimizer holds it
        self.hook_grads.append(stepped.grad.detach().float().clone())

    def configure_optimizers(self) -> Any:
        return self.make_optimizer(self.parameters())

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(data(), batch_size=BATCH)


def fit(module: L.LightningModule, epochs: int = 1, **trainer_args: Any) -> L.Trainer:
    trainer = L.Trainer(max_epochs=epochs, **{**QUIET, **trainer_args})
    trainer.fit(module)
    return trainer


def engine_loop(
    policy: str, *, epochs: int = 1, accumulate: int = 1, poison: set[int] = frozenset(),
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None, scheduler: Callable[[Any], Any] | None = None, **engine_args: Any,
) -> tuple[nn.Module, list[float], ampkit.Engine]:
    """The control: the same net, batches and optimizer (AdamW, or ``optimizer(params)``) through ampkit's own Engine
    loop; ``scheduler(optimizer)`` is adopted by the engine, which steps it after real steps only."""
    model = net()
    engine = ampkit.Engine(policy, accumulate=accumulate, **engine_args)
    opt = (optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-2)))(model.parameters())
    model, _ = engine.setup(model, opt, schedulers=scheduler(opt) if scheduler is not None else None)
    dtype = engine.policy.param_dtype  # a *-true policy's Lightning plugin casts the batch (convert_input): the same here
    losses = []
    for _ in range(epochs):
        for x, y in torch.utils.data.DataLoader(data(), batch_size=BATCH):
            with engine.autocast():
                loss = loss_of(model(x.to(dtype)), y)
            losses.append(loss.item())
            engine.backward(loss)
            if engine.steps in poison and engine.is_boundary:
                model[0].weight.grad[0, 0] = INF
            engine.step()
    return model, losses, engine


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.dtype == q.dtype, name
        torch.testing.assert_close(p, q, rtol=0, atol=0, equal_nan=True, msg=name)


@pytest.fixture(autouse=True)
def _quiet_lightning(caplog: pytest.LogCaptureFixture) -> None:
    """Lightning's advice on a CPU run (loader workers, the logger tip) is no concern of these tests."""
    import warnings

    from lightning.fabric.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


