"""Advice that is tried before it is given: the same training step fed by variants of the loop's DataLoader, each
timed, so the profile reports the step time each input-pipeline change really gives on this machine.

The variants change only how batches are produced, never which: the same dataset, sampler (or batch sampler),
collate function and order, with

* ``num_workers``: batches made in worker processes, in parallel with the step (the cure for a slow
  ``__getitem__``); tried at 1, 2 and 4 workers, no more than this process may use cores;
* ``pin_memory`` with ``non_blocking`` copies: page-locked batches copied asynchronously (CUDA only: on a CPU
  there is no copy to overlap);
* ``persistent_workers``: the workers are kept between epochs instead of being started again for each;
* ``prefetch_factor``: batches each worker keeps ready (DataLoader's default is 2);
* ``torch_threads``: on a CPU run, workers compete with torch's own threads for the cores; each worker count is
  also tried with torch left the cores the workers do not take (``torch.set_num_threads``), without which a
  small machine can show workers no gain at all.

Each trial runs whole epochs of a short cut of the dataset (a worker pool's start is paid at each epoch's first
batch, which is what ``persistent_workers`` saves) and records every step's time. Its ``step_s`` is what a step
costs as trained: the mean of the steady steps (past the epoch's start and the stock the workers build then,
before its last steps, which that stock serves while the workers sit idle), plus what the epoch cost beyond them
spread over the loader's real epoch (``len(loader)`` steps), not over the trial's short one, which would
overweight it.

    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
    >>> trials = try_loader_settings(loader, lambda batch: batch[0].sum(), "cpu",
    ...                              settings=[LoaderSettings(), LoaderSettings(num_workers=1)], steps_per_epoch=4)
    >>> [t.name for t in trials], trials[0].speedup
    (['as given', 'num_workers=1'], 1.0)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Subset

from .._util.model_io import to_device

__all__ = [
    "LoaderSettings", "Trial", "loader_settings", "loader_variant", "candidate_settings", "refinements", "try_loader_settings",
    "usable_cores", "MIN_GAIN",
]

log = logging.getLogger("ampkit")


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings a trial varies, and whether the loop copies its batches with ``non_blocking``."""

    num_workers: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    """Batches each worker keeps ready; None: DataLoader's default (2 with workers)."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` for the training process while the loader runs; None: as it is."""

    def label(self, base: LoaderSettings) -> str:
        """What differs from ``base``, as the keyword arguments that set it ("as given" when nothing does).

        >>> LoaderSettings(num_workers=2, persistent_workers=True).label(LoaderSettings())
        'num_workers=2, persistent_workers=True'
        """
        changed = [
            f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(base, f.name)
        ]
        return ", ".join(changed) or "as given"

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader keywords of these settings (``non_blocking`` is the copy's, ``torch_threads`` the process's)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs


@dataclass
class Trial:
    """One loader variant's measured steps."""

    settings: LoaderSettings
    name: str
    step_s: float
    """A step as trained: the mean steady step plus the epoch start spread over the loader's epoch."""
    median_step_s: float
    """Median step: the steady state, without the epoch starts."""
    epoch_start_s: float
    """The wait for an epoch's first batch (a worker pool's start), of the last epoch timed."""
    data_s: float = 0.0
    """Mean wait for a batch per steady step: what the step still spends waiting for data."""
    speedup: float = 1.0
    """The first trial's ``step_s`` over this one's."""
    baseline: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "settings": dataclasses.asdict(self.settings), "step_s": self.step_s,
            "median_step_s": self.median_step_s, "epoch_start_s": self.epoch_start_s, "speedup": self.speedup,
            "baseline": self.baseline, "phases": {"data": self.data_s},
        }


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def loader_settings(loader: DataLoader[Any]) -> LoaderSettings:
    """The settings ``loader`` was built with (``non_blocking`` False: the loop's copy is not the loader's).

    >>> from torch.utils.data import TensorDataset
    >>> loader_settings(DataLoader(TensorDataset(torch.ones(4)), num_workers=2, persistent_workers=True))
    LoaderSettings(num_workers=2, pin_memory=False, non_blocking=False, persistent_workers=True, prefetch_factor=2, torch_threads=None)
    """
    return LoaderSettings(
        num_workers=loader.num_workers, pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
    )


def loader_variant(loader: DataLoader[Any], settings: LoaderSettings, *, samples: int | None = None) -> DataLoader[Any]:
    """A DataLoader reading ``loader``'s dataset with the same batching, order and collation, set as ``settings``
    says; ``samples``: only the dataset's first that many items (a map-style dataset read in order).

    >>> from torch.utils.data import TensorDataset
    >>> variant = loader_variant(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4), LoaderSettings(num_workers=1))
    >>> [b[0].tolist() for b in variant]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """
    dataset = loader.dataset
    batching: dict[str, Any]
    if samples is not None:
        if isinstance(dataset, IterableDataset) or loader.batch_size is None:
            raise ValueError("loader_variant(samples=...) reads a map-style dataset in order, in batches of batch_size.")
        dataset = Subset(dataset, range(min(samples, len(dataset))))  # type: ignore[arg-type]
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    elif isinstance(dataset, IterableDataset):
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    else:
        # The loader's own batch sampler keeps its order (a seeded shuffle stays seeded) and its batch size.
        batching = {"batch_sampler": loader.batch_sampler}
    return DataLoader(
        dataset, collate_fn=loader.collate_fn, worker_init_fn=loader.worker_init_fn, timeout=loader.timeout,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator, **batching,
        **settings.loader_kwargs(),
    )


def candidate_settings(base: LoaderSettings, device: torch.device | str, *, cores: int | None = None) -> list[LoaderSettings]:
    """The worker counts worth trying from ``base`` on ``device``: 1, 2 and 4, as this machine's cores allow, and
    on a CPU run each also with torch's threads cut to the cores the workers leave.

    >>> [s.label(LoaderSettings()) for s in candidate_settings(LoaderSettings(), "cpu", cores=2)]
    ['num_workers=1', 'num_workers=1, torch_threads=1', 'num_workers=2', 'num_workers=2, torch_threads=1']
    """
    cores = usable_cores() if cores is None else cores
    on_cpu = torch.device(device).type == "cpu"
    out = []
    for n in (1, 2, 4):
        if n > cores or n == base.num_workers:
            continue
        out.append(dataclasses.replace(base, num_workers=n))
        if on_cpu and cores > 1:
            out.append(dataclasses.replace(base, num_workers=n, torch_threads=max(1, cores - n)))
    return out


def _persistent(best: LoaderSettings, device: torch.device) -> LoaderSettings | None:
    return dataclasses.replace(best, persistent_workers=True) if best.num_workers > 0 and not best.persistent_workers else None


def _prefetch(best: LoaderSettings, device: torch.device) -> LoaderSettings | None:
    return dataclasses.replace(best, prefetch_factor=4) if best.num_workers > 0 and (best.prefetch_factor or 2) < 4 else None


def _pinned(best: LoaderSettings, device: torch.device) -> LoaderSettings | None:
    if device.type != "cuda" or (best.pin_memory and best.non_blocking):
        return None
    return dataclasses.replace(best, pin_memory=True, non_blocking=True)


_REFINEMENTS = (_persistent, _prefetch, _pinned)
"""The changes tried, in turn, on top of the best setting so far."""


def refinements(best: LoaderSettings, device: torch.device | str) -> list[LoaderSettings]:
    """What is tried on top of ``best``, one change at a time (the search keeps each that measurably helps and
    builds the next on it): persistent workers and a deeper prefetch (with workers), pinned memory with
    non-blocking copies (CUDA).

    >>> [s.label(LoaderSettings()) for s in refinements(LoaderSettings(num_workers=2), "cuda")]
    ['num_workers=2, persistent_workers=True', 'num_workers=2, prefetch_factor=4', 'num_workers=2, pin_memory=True, non_blocking=True']
    """
    device = torch.device(device)
    return [v for v in (change(best, device) for change in _REFINEMENTS) if v is not None]


def _depth(settings: LoaderSettings) -> int:
    """Batches a loader with ``settings`` can have made ahead: what an epoch's start lets it stock."""
    return settings.num_workers * (settings.prefetch_factor or 2) if settings.num_workers else 1


def _timed_epochs(
    loader: DataLoader[Any], step: Callable[[Any], Any], device: torch.device, settings: LoaderSettings,
    epochs: int, steps_per_epoch: int, channels_last: bool,
) -> list[list[tuple[float, float]]]:
    """Per epoch, each step's (seconds from the previous step's end, of which the host waited for its batch).

    On CUDA a step's time is the device's, between events recorded at the steps' ends (read once per epoch): the
    host may run ahead of the device as in training, and a step the device idles in, waiting for its batch, shows.
    """
    cuda = device.type == "cuda"
    out = []
    for _ in range(epochs):
        ends, waits = [], []
        start = time.perf_counter()
        ends.append(_event() if cuda else start)
        for index, batch in enumerate(loader):
            if index >= steps_per_epoch:
                break
            fetched = time.perf_counter()
            step(to_device(batch, device, channels_last, non_blocking=settings.non_blocking))
            now = time.perf_counter()
            ends.append(_event() if cuda else now)
            waits.append(fetched - start)
            start = now
        if cuda:
            torch.cuda.synchronize(device)  # once per epoch: the events' times are then known
            seconds = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(ends)]
        else:
            seconds = [b - a for a, b in itertools.pairwise(ends)]
        out.append(list(zip(seconds, waits)))
    return out


def _event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _measure(
    loader: DataLoader[Any], variant: LoaderSettings, step: Callable[[Any], Any], device: torch.device, *,
    epochs: int, steps_per_epoch: int, epoch_steps: int, channels_last: bool, label: str,
) -> Trial:
    # An epoch's steps are not alike: at its start the workers are starting and stock batches, and its last
    # ``depth`` steps are served from that stock while the workers sit idle, so the step runs alone on the cores.
    # Steady steps are those between: after twice the depth, before the last depth.
    depth = _depth(variant)
    head, tail = 2 * depth, depth
    per_epoch = max(steps_per_epoch, head + tail + 8)
    samples = None
    if not isinstance(loader.dataset, IterableDataset) and loader.batch_size is not None and not _shuffled(loader):
        samples = per_epoch * loader.batch_size  # an epoch ends, and starts again, within the trial
    # Every epoch of a loader without persistent workers starts alike, so one tells; persistent workers start
    # once, and the epochs after the first show what they save.
    runs_wanted = epochs if variant.persistent_workers else 1
    threads = torch.get_num_threads()
    try:
        if variant.torch_threads is not None:
            torch.set_num_threads(variant.torch_threads)
        runs = _timed_epochs(loader_variant(loader, variant, samples=samples), step, device, variant, runs_wanted, per_epoch, channels_last)
    finally:
        torch.set_num_threads(threads)
    steady = [t for run in runs for t in run[head : len(run) - tail]]
    if not steady:
        raise ValueError(
            f"the loader gave {max(len(r) for r in runs)} batches an epoch: too few to time its steady steps between the "
            f"first {head} and the last {tail}; give it more data."
        )
    mean = statistics.fmean(t for t, _ in steady)
    # What an epoch as it repeats costs beyond its steps at the steady pace (the workers' start and stocking, less
    # the fast end), paid once per real epoch: spread over the loader's own epoch, not the trial's short one.
    last = runs[-1]
    excess = sum(t for t, _ in last) - len(last) * mean
    return Trial(
        variant, label, mean + excess / max(epoch_steps, per_epoch), statistics.median(t for t, _ in steady),
        last[0][1], statistics.fmean(w for _, w in steady),
    )


def try_loader_settings(
    loader: DataLoader[Any],
    step: Callable[[Any], Any],
    device: torch.device | str,
    *,
    settings: list[LoaderSettings] | None = None,
    epochs: int = 2,
    steps_per_epoch: int = 8,
    channels_last: bool = False,
) -> list[Trial]:
    """Time ``step(batch)`` fed by ``loader`` as given, then by variants of it: one epoch each, ``epochs`` for
    persistent workers (whose later epochs start differently from the first).

    ``settings``: the variants to time; None searches: the worker counts of :func:`candidate_settings`, then, on
    top of the fastest of them, each of :func:`refinements` in turn, kept when it beats it by :data:`MIN_GAIN`.
    ``step`` receives the batch already on ``device`` and runs one training step (forward, backward, optimizer).
    A map-style dataset read in order is cut to each trial's epoch (at least ``steps_per_epoch`` steps, more for a
    deep prefetch, whose start and end take longer to pass) so that epochs end and start again within the trial. The first trial is the baseline of the
    others' ``speedup``. A variant that fails (a dataset that cannot be sent to a worker process, say) is logged and
    left out; the loader as given failing raises.
    """
    device = torch.device(device)
    base = loader_settings(loader)
    try:
        epoch_steps = max(1, len(loader))  # the real epoch, over which an epoch's start is paid once
    except TypeError:  # an iterable dataset without a length
        epoch_steps = steps_per_epoch

    def measure(variant: LoaderSettings) -> Trial | None:
        try:
            return _measure(loader, variant, step, device, epochs=epochs, steps_per_epoch=steps_per_epoch, epoch_steps=epoch_steps,
                            channels_last=channels_last, label=variant.label(base))
        except Exception as exc:
            if variant == base:
                raise
            log.warning("ampkit profile: the loader with %s failed (%s); it is left out of the trials.", variant.label(base), exc)
            return None

    baseline = measure(base)
    assert baseline is not None  # the loader as given raises rather than fail quietly
    baseline.baseline = True
    trials = [baseline]
    if settings is not None:
        trials += [t for t in (measure(s) for s in settings if s != base) if t is not None]
    else:
        trials += [t for t in (measure(s) for s in candidate_settings(base, device)) if t is not None]
        # Refinements build on the fastest setting with workers: persistent workers can rescue a worker count that
        # lost on its start cost alone.
        best = min([t for t in trials if t.settings.num_workers > 0] or trials, key=lambda t: t.step_s)
        for change in _REFINEMENTS:
            variant = change(best.settings, device)
            trial = measure(variant) if variant is not None else None
            if trial is None:
                continue
            trials.append(trial)
            if trial.step_s * MIN_GAIN < best.step_s:
                best = trial
    for t in trials:
        t.speedup = baseline.step_s / t.step_s
    return trials


MIN_GAIN = 1.03
"""A refinement is kept (and the next built on it) when it makes the step this much faster."""

def _shuffled(loader: DataLoader[Any]) -> bool:
    # A shuffling sampler reads the whole dataset in its own order: cutting it would change which batches come.
    return not isinstance(getattr(loader, "sampler", None), torch.utils.data.SequentialSampler)
