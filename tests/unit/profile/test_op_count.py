"""count_step: the aten ops and host syncs of one step, counted the same on every run."""

from __future__ import annotations

import torch
from torch import nn

from ampkit.profile._op_count import StepCounts, count_step


def _sgd_step() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)


def test_ops_are_counted_with_the_backward_and_a_read_is_a_sync() -> None:
    model, opt = _sgd_step()

    def step(x: torch.Tensor, read: bool) -> None:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if read:
            loss.item()

    x = torch.ones(3, 4)
    quiet, reading = count_step(step, x, False), count_step(step, x, True)
    assert quiet.syncs == 0 and reading.syncs == 1
    assert reading - quiet == {"aten._local_scalar_dense.default": 1} and reading.ops == quiet.ops + 1
    # Forward and backward of both layers, and one foreach update for every parameter.
    assert quiet.by_op["aten.addmm.default"] == 2 and quiet.by_op["aten.threshold_backward.default"] == 1
    assert quiet.by_op["aten._foreach_add_.List"] == 1
    assert quiet.ops == sum(quiet.by_op.values())
    assert count_step(step, x, False) == quiet  # deterministic


def test_the_warm_up_steps_are_not_counted() -> None:
    calls: list[bool] = []

    def step(x: torch.Tensor) -> None:
        calls.append(True)
        if len(calls) == 1:
            torch.zeros(1000).sum()  # first-step work (state, caches) that later steps do not repeat
        x.add(1)

    counts = count_step(step, torch.ones(2), warmup=1)
    assert len(calls) == 2 and counts == StepCounts(ops=1, syncs=0, by_op=counts.by_op) and counts.by_op == {"aten.add.Tensor": 1}


def test_the_librarys_own_reads_are_counted_too() -> None:
    """torch's single-tensor Adam reads its step counter: not the loop's line (SyncFinder leaves it out), but a
    step compared whole counts it."""
    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), foreach=False)

    def step() -> None:
        model(torch.ones(2, 4)).sum().backward()
        opt.step()

    assert count_step(step).syncs == 2  # one read per parameter
