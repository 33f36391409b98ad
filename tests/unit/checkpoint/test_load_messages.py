"""engine.load() on a file that is not a checkpoint names what it is; on a checkpoint whose learning rate differs from
the one the run was built with, one WARNING says the checkpoint's wins and how to set the new one. Twins: a real
checkpoint loads, and the same rate (or a scheduled one, which a resume is meant to restore) says nothing."""

from __future__ import annotations

import logging
import pathlib

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine


def run(lr: float, *, scheduled: bool = False) -> tuple[Engine, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5) if scheduled else None
    engine = Engine()
    model, opt = engine.setup(model, opt, schedulers=sched)
    engine.backward(model(torch.ones(2, 4)).sum())
    engine.step()
    return engine, opt


@pytest.mark.parametrize(("content", "match"), [
    (b"epoch 3: loss 0.41\n", r"notes.bin is not a checkpoint: it holds text \('epoch 3: loss 0.41'\)"),
    (b"\x00\x01\x02\xffGIF89a....", r"notes.bin is not a checkpoint: it holds data of another format"),
])
def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path: pathlib.Path, content: bytes, match: str) -> None:
    path = tmp_path / "notes.bin"
    path.write_bytes(content)
    engine, _ = run(0.1)
    with pytest.raises(CheckpointError, match=match):
        engine.load(path)
    engine.save(tmp_path / "real.pt")  # the twin: a checkpoint loads
    engine.load(tmp_path / "real.pt")


def test_a_changed_learning_rate_is_named_once_with_which_wins(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    saved, _ = run(0.1)
    saved.save(tmp_path / "c.pt")
    resumed, opt = run(0.01)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        resumed.load(tmp_path / "c.pt")
    (record,) = caplog.records
    assert "built with lr=0.01, the checkpoint holds lr=0.1: the checkpoint's wins" in record.getMessage()
    assert opt.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("scheduled", [False, True])
def test_the_same_rate_or_a_scheduled_one_loads_silently(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, scheduled: bool) -> None:
    saved, saved_opt = run(0.1, scheduled=scheduled)
    saved.save(tmp_path / "c.pt")
    resumed, opt = run(0.1, scheduled=scheduled)
    resumed.optimizers[0].param_groups[0]["lr"] = 0.1  # a fresh run's scheduled rate differs from the saved one's
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        resumed.load(tmp_path / "c.pt")
    assert not caplog.records and opt.param_groups[0]["lr"] == saved_opt.param_groups[0]["lr"]
