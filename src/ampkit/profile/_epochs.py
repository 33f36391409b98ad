"""A loader's epochs timed step by step, to a deadline: the measurement under each of the loader's trials.

Each step's time is taken from the previous step's end to its own, so it holds the wait for its batch; that wait
is also kept on its own. With a ``deadline`` the clock is read once after each step, and the epochs stop after the
step during which it passed: a trial overruns its deadline by one step at most. The iterator is let go as soon as
an epoch ends or stops, so the workers of a loader without persistent ones exit then (a persistent pool lives as
long as its loader: the caller drops the loader to end it).

    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    >>> now = [0.0]
    >>> def step(batch):
    ...     now[0] += 1.0  # a fake clock: each step takes one second by it
    >>> timed = timed_epochs(loader, step, "cpu", epochs=1, steps_per_epoch=4, deadline=2.5, clock=lambda: now[0])
    >>> len(timed.runs[0]), timed.stopped  # the deadline passed during the third step, of four
    (3, True)
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._util.model_io import to_device

__all__ = ["TimedEpochs", "timed_epochs"]


@dataclass
class TimedEpochs:
    """What :func:`timed_epochs` measured."""

    runs: list[list[tuple[float, float]]]
    """Per epoch begun, each step's (seconds from the previous step's end, of which the host waited for its batch)."""
    stopped: bool = False
    """The deadline passed before every epoch asked for had all its steps: the last run is partial."""

    @property
    def steps(self) -> int:
        """Steps taken, over all the runs."""
        return sum(len(run) for run in self.runs)


def timed_epochs(
    loader: DataLoader[Any], step: Callable[[Any], Any], device: torch.device | str, *, epochs: int, steps_per_epoch: int,
    non_blocking: bool = False, channels_last: bool = False, deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TimedEpochs:
    """Run ``epochs`` epochs of ``loader``, each cut to ``steps_per_epoch`` steps, calling ``step`` on each batch
    moved to ``device``; with a ``deadline`` (a time by ``clock``), stop after the step during which it passed.

    On CUDA a step's time is the device's, between events recorded at the steps' ends (read once per epoch): the
    host may run ahead of the device as in training, and a step the device idles in, waiting for its batch, shows.
    The deadline is the host's: ``clock`` is read after ``step`` returns, with no sync, so the work the host has
    queued by then still runs after it (one synchronize at the epoch's end, as without a deadline).

    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> timed = timed_epochs(DataLoader(TensorDataset(torch.ones(6)), batch_size=2), lambda b: None, "cpu",
    ...                      epochs=2, steps_per_epoch=8)
    >>> [len(run) for run in timed.runs], timed.stopped  # the loader's whole epoch, twice
    ([3, 3], False)
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    try:
        wanted = min(steps_per_epoch, len(loader))  # an epoch shorter than the cut ends without being stopped
    except TypeError:  # an iterable dataset without a length
        wanted = steps_per_epoch
    out: list[list[tuple[float, float]]] = []
    stopped = False
    for epoch in range(epochs):
        ends, waits = [], []
        start = time.perf_counter()
        ends.append(_event() if cuda else start)
        iterator = iter(loader)
        try:
            for index, batch in enumerate(iterator):
                if index >= steps_per_epoch:
                    break
                fetched = time.perf_counter()
                step(to_device(batch, device, channels_last, non_blocking=non_blocking))
                now = time.perf_counter()
                ends.append(_event() if cuda else now)
                waits.append(fetched - start)
                start = now
                if deadline is not None and clock() > deadline:
                    # Stopped, unless this was the last step asked for: then the epochs are whole after all.
                    stopped = index + 1 < wanted or epoch + 1 < epochs
                    break
        finally:
            # Let the iterator go now, even when the step raised (a traceback would keep it): a pool of workers that
            # are not persistent exits with it (its __del__ joins them) before anything else starts.
            del iterator
        if cuda:
            torch.cuda.synchronize(device)  # once per epoch: the events' times are then known
            seconds = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(ends)]
        else:
            seconds = [b - a for a, b in itertools.pairwise(ends)]
        out.append(list(zip(seconds, waits)))
        if stopped:
            break
    return TimedEpochs(out, stopped)


def _event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
