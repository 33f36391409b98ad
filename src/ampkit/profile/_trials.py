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

A ``deadline`` keeps the trials to a time: none starts after it, and the one under way stops after the step during
which it passed and is left out (a partial epoch is not judged); each trial's ``wall_s`` says what it took.

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
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ._epochs import timed_epochs
from ._variants import LoaderSettings, loader_settings, loader_variant

__all__ = [
    "LoaderSettings", "Trial", "loader_settings", "loader_variant", "candidate_settings", "refinements", "search_size", "try_loader_settings",
    "usable_cores", "MIN_GAIN",
]

log = logging.getLogger("ampkit")


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
    wall_s: float = 0.0
    """Seconds the trial took by the trials' ``clock`` (wall seconds by default), from building its loader to its
    workers' exit: what timing this variant costs, its workers' start-up included."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "settings": dataclasses.asdict(self.settings), "step_s": self.step_s,
            "median_step_s": self.median_step_s, "epoch_start_s": self.epoch_start_s, "speedup": self.speedup,
            "baseline": self.baseline, "phases": {"data": self.data_s}, "wall_s": self.wall_s,
        }


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


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


def search_size(loader: DataLoader[Any], device: torch.device | str) -> int:
    """The most trials :func:`try_loader_settings`' search runs on ``loader``: the loader as given, the worker counts
    of :func:`candidate_settings`, and each refinement (one may not apply).

    >>> from torch.utils.data import TensorDataset
    >>> search_size(DataLoader(TensorDataset(torch.zeros(4)), batch_size=2), "cpu") >= 4
    True
    """
    return 1 + len(candidate_settings(loader_settings(loader), device)) + len(_REFINEMENTS)


def _depth(settings: LoaderSettings) -> int:
    """Batches a loader with ``settings`` can have made ahead: what an epoch's start lets it stock."""
    return settings.num_workers * (settings.prefetch_factor or 2) if settings.num_workers else 1


class _DeadlinePassed(Exception):
    """The deadline stopped a trial short of the steps it needs (the message says how far it got)."""


def _measure(
    loader: DataLoader[Any], variant: LoaderSettings, step: Callable[[Any], Any], device: torch.device, *,
    epochs: int, steps_per_epoch: int, epoch_steps: int, channels_last: bool, label: str,
    deadline: float | None, clock: Callable[[], float],
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
    variant_loader = loader_variant(loader, variant, samples=samples)
    try:
        if variant.torch_threads is not None:
            torch.set_num_threads(variant.torch_threads)
        timed = timed_epochs(variant_loader, step, device, epochs=runs_wanted, steps_per_epoch=per_epoch, non_blocking=variant.non_blocking,
                             channels_last=channels_last, deadline=deadline, clock=clock)
    finally:
        torch.set_num_threads(threads)
        # A persistent pool of workers lives as long as its loader: dropping the loader now (its last reference) makes
        # the workers exit before the next variant starts, stopped early or not.
        del variant_loader
    if timed.stopped:
        # Never judged on a partial epoch: its steady steps, start and end are not those of an epoch as trained.
        raise _DeadlinePassed(f"the deadline passed after {timed.steps} of its {runs_wanted} x {per_epoch} steps")
    runs = timed.runs
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
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_trial: Callable[[str], None] | None = None,
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

    ``deadline``: a time by ``clock`` (``time.monotonic() + seconds`` by default), not a duration. No variant starts
    once ``clock() > deadline``, and the one under way stops after the step during which it passed (the clock is
    read once a step), so the trials overrun it by one step at most. A variant stopped short of its epochs is left
    out (logged): a partial epoch is never judged. The loader as given is timed first; if the deadline stops it, or
    had passed before it started, no variant can be compared and :class:`TimeoutError` is raised. Each trial's
    ``wall_s`` is what it took by ``clock``: the baseline's tells what the rest may cost (a variant with workers pays
    their start-up on top). None (the default) runs every variant to its end.

    ``on_trial(label)`` is called as each variant is about to be timed (the progress of ``ampkit profile``).
    """
    device = torch.device(device)
    base = loader_settings(loader)
    try:
        epoch_steps = max(1, len(loader))  # the real epoch, over which an epoch's start is paid once
    except TypeError:  # an iterable dataset without a length
        epoch_steps = steps_per_epoch

    def measure(variant: LoaderSettings) -> Trial | None:
        label = variant.label(base)
        if on_trial is not None:
            on_trial(label)
        started = clock()
        if deadline is not None and started > deadline:
            if variant == base:
                raise TimeoutError(
                    f"ampkit profile: the deadline had passed ({started - deadline:.3g} s ago by `clock`) before the loader as "
                    "given was timed, so no variant can be compared: a deadline is a time by `clock` (time.monotonic() + "
                    "seconds by default), not a duration; give the trials a later one, or deadline=None."
                )
            log.info("ampkit profile: the deadline has passed: the loader with %s is not tried.", label)
            return None
        try:
            trial = _measure(loader, variant, step, device, epochs=epochs, steps_per_epoch=steps_per_epoch, epoch_steps=epoch_steps,
                             channels_last=channels_last, label=label, deadline=deadline, clock=clock)
        except _DeadlinePassed as stopped:
            if variant == base:
                raise TimeoutError(
                    f"ampkit profile: the deadline passed before the loader as given was timed ({stopped}), so no variant "
                    "can be compared: give the trials a later deadline, or deadline=None."
                ) from None
            log.info("ampkit profile: the loader with %s is left out of the trials: %s (a partial epoch is not judged).", label, stopped)
            return None
        except Exception as exc:
            if variant == base:
                raise
            log.warning("ampkit profile: the loader with %s failed (%s); it is left out of the trials.", label, exc)
            return None
        trial.wall_s = clock() - started
        return trial

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
