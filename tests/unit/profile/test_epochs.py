"""A loader's timed epochs: the deadline stops them after the step it passed in, an epoch that is whole is not called
stopped, and a worker pool is let go as soon as its epoch ends, even when the step raised."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ampkit.profile._epochs import timed_epochs


class Ticking:
    """A step that advances a fake clock one second, and the clock it advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self, batch: object) -> None:
        self.now += 1.0

    def clock(self) -> float:
        return self.now


def _loader(batches: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(2.0 * batches)), batch_size=2)


@pytest.mark.parametrize(("deadline", "steps", "stopped"), [
    (0.5, [1], True),  # passed in the first step: that step ends the epochs
    (4.5, [4, 1], True),  # in the first step of the second epoch
    (3.5, [4], True),  # in the last step of the first epoch: the second is not started
    (7.5, [4, 4], False),  # in the last step of the last epoch: nothing was left to do
    (100.0, [4, 4], False),
])
def test_the_epochs_stop_after_the_step_the_deadline_passed_in(deadline: float, steps: list[int], stopped: bool) -> None:
    tick = Ticking()
    timed = timed_epochs(_loader(10), tick, "cpu", epochs=2, steps_per_epoch=4, deadline=deadline, clock=tick.clock)
    assert [len(run) for run in timed.runs] == steps and timed.stopped is stopped and timed.steps == sum(steps)
    assert tick.now == sum(steps)


def test_an_epoch_shorter_than_the_cut_that_ends_as_the_deadline_passes_is_whole() -> None:
    tick = Ticking()
    timed = timed_epochs(_loader(3), tick, "cpu", epochs=1, steps_per_epoch=8, deadline=2.5, clock=tick.clock)
    assert [len(run) for run in timed.runs] == [3] and not timed.stopped


def test_each_step_is_timed_with_its_wait_for_the_batch() -> None:
    timed = timed_epochs(_loader(5), lambda b: None, "cpu", epochs=1, steps_per_epoch=8)
    (run,) = timed.runs
    assert len(run) == 5 and all(0 <= wait <= seconds for seconds, wait in run)


def test_the_workers_exit_when_the_step_raises_even_while_the_error_is_held() -> None:
    before = set(multiprocessing.active_children())
    seen: list[int] = []

    def step(batch: object) -> None:
        seen.append(len(set(multiprocessing.active_children()) - before))
        raise RuntimeError("a step that fails")

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=1)
    with pytest.raises(RuntimeError, match="a step that fails") as held:
        timed_epochs(loader, step, "cpu", epochs=1, steps_per_epoch=4)
    assert seen == [1]  # the worker ran the epoch
    assert held.value.__traceback__ is not None  # the traceback, and the frame that held the iterator, are alive
    assert set(multiprocessing.active_children()) - before == set()
