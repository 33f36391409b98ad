"""The resume recipe of docs/getting-started.md with a shuffling DataLoader: stopped mid-epoch (not the first epoch) and resumed,
the run ends bitwise equal to an uninterrupted one.

The recipe gives the loader its own generator, seeded from the epoch, so the order of an epoch does not depend
on the global RNG (which `engine.load()` restores to its state at the save, i.e. mid-epoch, after the shuffle).
With the quick start's `engine.start_epoch(len(loader))` in the loop, the call after the load continues the
epoch the checkpoint stopped in, so the resumed windows are the uninterrupted run's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ampkit

SEED = 7
EPOCHS = 3


def make_run(accumulate: int = 2) -> tuple[ampkit.Engine, nn.Module, DataLoader, torch.Generator]:
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(6, 24), nn.GELU(), nn.Dropout(0.3), nn.Linear(24, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    engine = ampkit.Engine("bf16-mixed", accumulate=accumulate)
    model, _ = engine.setup(model, opt, schedulers=sched)
    data = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(40, 6, generator=data), torch.randint(0, 3, (40,), generator=data))
    order = torch.Generator()
    return engine, model, DataLoader(dataset, batch_size=4, shuffle=True, generator=order), order


def train(path: Path, stop_at: tuple[int, int] | None, *, accumulate: int = 2, declare: bool = False) -> list[torch.Tensor]:
    """The recipe's loop; ``stop_at=(epoch, batch)`` saves after that batch and returns (the process "dies").
    ``declare``: with the quick start's ``engine.start_epoch(len(loader))`` at each epoch's start."""
    engine, model, loader, order = make_run(accumulate)
    start = engine.load(path) if ampkit.checkpoint_exists(path) else None
    first_epoch, done = (start["epoch"], start["batch"] + 1) if start else (0, 0)
    for epoch in range(first_epoch, EPOCHS):
        order.manual_seed(SEED + epoch)  # this epoch's order, whatever the global RNG holds
        if declare:
            engine.start_epoch(len(loader))  # the quick start's line: the epoch's last window may be short
        for i, (x, y) in enumerate(loader):
            if epoch == first_epoch and i < done:
                continue  # trained before the stop
            with engine.autocast():
                loss = nn.functional.cross_entropy(model(x).float(), y)
            engine.backward(loss)
            engine.step()
            if (epoch, i) == stop_at:
                engine.save(path, extra={"epoch": epoch, "batch": i})
                return []
    return [p.detach().clone() for p in model.parameters()]


def test_mid_epoch_resume_with_a_shuffling_loader_is_bitwise(tmp_path: Path) -> None:
    reference = train(tmp_path / "none.pt", stop_at=None)
    path = tmp_path / "last.pt"
    # Stop inside epoch 1, in the middle of an accumulation window (batch 4 is the 5th micro-batch).
    assert train(path, stop_at=(1, 4)) == []
    resumed = train(path, stop_at=None)
    assert len(resumed) == len(reference)
    for a, b in zip(resumed, reference):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def declared_reference(tmp_path_factory: pytest.TempPathFactory) -> list[torch.Tensor]:
    """The uninterrupted run with ``start_epoch`` in the loop, accumulate=3: one for every stop below."""
    return train(tmp_path_factory.mktemp("reference") / "none.pt", stop_at=None, accumulate=3, declare=True)


@pytest.mark.parametrize("stop_at", [(1, 4), (1, 5), (1, 9)], ids=["mid-window", "boundary", "epoch-end"])
def test_resume_with_start_epoch_in_the_loop_is_bitwise(tmp_path: Path, declared_reference: list[torch.Tensor], stop_at: tuple[int, int]) -> None:
    """The quick start's ``start_epoch(len(loader))`` in the resume recipe, accumulate=3 over 10 batches (windows
    of 3, 3, 3 and a short 1): stopped with 2 micro-batches pending (batch 4 is the 5th), at a window boundary
    inside the epoch, and at the epoch's end, the resumed run equals the uninterrupted one bit for bit."""
    path = tmp_path / "last.pt"
    assert train(path, stop_at=stop_at, accumulate=3, declare=True) == []
    resumed = train(path, stop_at=None, accumulate=3, declare=True)
    assert len(resumed) == len(declared_reference)
    for a, b in zip(resumed, declared_reference):
        assert torch.equal(a, b)
