"""Loader trials: the variants read the same batches in the same order, and a slow dataset's step is measurably
faster with workers (a control: the delay sleeps, so workers overlap it with the step even on a busy 2-core machine)."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ampkit.profile import LoaderSettings, candidate_settings, loader_variant, try_loader_settings
from ampkit.profile._trials import loader_settings, refinements

DELAY = 0.01  # seconds per batch of per-sample work, slept: a worker overlaps it whatever the CPU load


class SleepyRows(Dataset):
    def __init__(self, n: int, delay: float) -> None:
        self.x = torch.arange(float(n)).unsqueeze(1)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return self.x[i]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_variant_reads_the_same_batches_in_the_same_order(shuffle: bool) -> None:
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=8, shuffle=shuffle, generator=generator)
    variant = loader_variant(loader, LoaderSettings(num_workers=2, persistent_workers=True, prefetch_factor=4))
    assert variant.num_workers == 2 and variant.persistent_workers and variant.prefetch_factor == 4
    state = generator.get_state()
    given = [b[0].tolist() for b in loader]
    generator.set_state(state)  # a shuffling sampler draws each epoch's order from the loader's generator
    assert [b[0].tolist() for b in variant] == given


def test_a_variant_cut_to_some_samples_reads_the_first_ones() -> None:
    loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=8)
    assert [b[0].tolist() for b in loader_variant(loader, LoaderSettings(), samples=16)] == [list(map(float, range(8))), list(map(float, range(8, 16)))]


def test_the_candidates_respect_the_cores_and_the_refinements_pin_memory_only_for_cuda() -> None:
    assert candidate_settings(LoaderSettings(), "cpu", cores=1) == [LoaderSettings(num_workers=1)]
    # On a CPU run the workers share the cores with torch's threads: each count is also tried with fewer threads.
    two = candidate_settings(LoaderSettings(), "cpu", cores=2)
    assert [(s.num_workers, s.torch_threads) for s in two] == [(1, None), (1, 1), (2, None), (2, 1)]
    cuda = candidate_settings(LoaderSettings(), "cuda", cores=8)
    assert [s.num_workers for s in cuda] == [1, 2, 4] and all(s.torch_threads is None for s in cuda)
    workers = LoaderSettings(num_workers=2)
    assert not any(s.pin_memory for s in refinements(workers, "cpu"))
    assert refinements(workers, "cuda")[-1] == LoaderSettings(num_workers=2, pin_memory=True, non_blocking=True)
    assert refinements(LoaderSettings(), "cpu") == []  # persistence and prefetch need workers


def test_the_loaders_settings_are_read_back() -> None:
    loader = DataLoader(TensorDataset(torch.ones(4)), num_workers=1, prefetch_factor=3)
    assert loader_settings(loader) == LoaderSettings(num_workers=1, prefetch_factor=3)


def test_workers_measurably_speed_a_step_fed_by_a_slow_dataset() -> None:
    def step(batch: torch.Tensor) -> None:
        time.sleep(4 * DELAY)  # the step's compute, also slept so the trial's timing is the pipeline's alone

    loader = DataLoader(SleepyRows(64, DELAY / 4), batch_size=4)  # DELAY of per-sample work per batch
    trials = try_loader_settings(loader, step, "cpu", settings=[LoaderSettings(num_workers=2)], steps_per_epoch=6)
    base, workers = trials
    assert base.baseline and base.name == "as given" and workers.name == "num_workers=2"
    # As given: step + data = 5 DELAY; with workers the data hides behind the step: 4 DELAY (+ epoch starts).
    assert base.median_step_s == pytest.approx(5 * DELAY, rel=0.3)
    assert workers.median_step_s == pytest.approx(4 * DELAY, rel=0.3)
    assert workers.speedup == pytest.approx(base.step_s / workers.step_s)
    assert workers.epoch_start_s > base.epoch_start_s  # starting two worker processes is not free


def test_a_variant_that_fails_is_left_out_and_the_others_kept(caplog: pytest.LogCaptureFixture) -> None:
    loader = DataLoader(TensorDataset(torch.ones(8)), batch_size=2)
    bad = LoaderSettings(num_workers=1, prefetch_factor=-1)  # DataLoader refuses it
    trials = try_loader_settings(loader, lambda b: None, "cpu", settings=[bad], steps_per_epoch=3)
    assert [t.name for t in trials] == ["as given"]
    assert "failed" in caplog.text and "left out" in caplog.text


def test_too_little_data_for_the_steady_steps_is_refused_with_the_fix() -> None:
    loader = DataLoader(TensorDataset(torch.ones(2)), batch_size=2)
    with pytest.raises(ValueError, match="too few to time its steady steps"):
        try_loader_settings(loader, lambda b: None, "cpu", settings=[], steps_per_epoch=1, epochs=1)


def _slow_start(worker_id: int) -> None:
    time.sleep(0.15)  # a worker that takes long to start (imports, opening files): what persistent workers save


def test_the_search_keeps_a_refinement_that_helps_and_builds_the_next_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ampkit.profile._trials.usable_cores", lambda: 1)
    loader = DataLoader(SleepyRows(80, DELAY / 4), batch_size=4, worker_init_fn=_slow_start)  # an epoch: 20 steps
    trials = try_loader_settings(loader, lambda b: time.sleep(2 * DELAY), "cpu", steps_per_epoch=4, epochs=3)
    names = [t.name for t in trials]
    assert names == ["as given", "num_workers=1", "num_workers=1, persistent_workers=True", "num_workers=1, persistent_workers=True, prefetch_factor=4"]
    by_name = {t.name: t for t in trials}
    # Restarting the slow worker every epoch costs more than the data it overlaps in an epoch of 20 steps.
    assert by_name["num_workers=1, persistent_workers=True"].step_s < by_name["num_workers=1"].step_s
    assert by_name["num_workers=1, persistent_workers=True"].epoch_start_s < by_name["num_workers=1"].epoch_start_s


def test_a_trial_with_fewer_torch_threads_runs_with_them_and_restores_them() -> None:
    seen: list[int] = []
    loader = DataLoader(TensorDataset(torch.ones(8)), batch_size=2)
    before = torch.get_num_threads()
    try_loader_settings(loader, lambda b: seen.append(torch.get_num_threads()), "cpu", settings=[LoaderSettings(torch_threads=1)], steps_per_epoch=2, epochs=1)
    assert seen == [before] * 4 + [1] * 4 and torch.get_num_threads() == before  # 4 steps each: its whole epoch


# -- the deadline ---------------------------------------------------------------------------------------------------
# A fake clock, advanced one second by each step: the deadline's checks are then exact, whatever the machine's load.
# A loader of 32 batches read in order; with no workers each trial's epoch is cut to 11 steps (its first 2, its last
# one and 8 steady), and with one worker to 14 (a prefetch of 2: its first 4, its last 2 and 8 steady).
STEPS_NO_WORKERS, STEPS_ONE_WORKER = 11, 14
OTHERS = [LoaderSettings(torch_threads=1), LoaderSettings(non_blocking=True)]  # variants without workers: cheap


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now, self.reads = now, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _ticking(clock: FakeClock, taken: list[float]) -> Callable[[Any], None]:
    def step(batch: Any) -> None:
        clock.now += 1.0  # the step takes one second by the clock
        taken.append(clock.now)

    return step


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(64.0)), batch_size=2)


def _trials(deadline: float | None, clock: FakeClock, taken: list[float], **kw: Any) -> list[Any]:
    return try_loader_settings(_loader(), _ticking(clock, taken), "cpu", settings=kw.pop("settings", OTHERS), steps_per_epoch=4,
                               deadline=deadline, clock=clock, **kw)


def test_no_variant_starts_once_the_deadline_has_passed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ampkit")
    clock, taken = FakeClock(), []
    # The deadline passes during the baseline's last step: its epoch is whole, so it is kept; nothing starts after.
    trials = _trials(STEPS_NO_WORKERS - 0.5, clock, taken)
    assert [t.name for t in trials] == ["as given"] and len(taken) == STEPS_NO_WORKERS
    assert trials[0].wall_s == STEPS_NO_WORKERS  # its seconds by the clock: what the tune estimates the rest from
    assert caplog.text.count("is not tried") == len(OTHERS)


@pytest.mark.parametrize("into_variant", [0.0, 5.5, 9.5])
def test_a_variant_stops_after_the_step_the_deadline_passed_in_and_is_left_out(into_variant: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ampkit")
    clock, taken = FakeClock(), []
    deadline = STEPS_NO_WORKERS + into_variant  # the first variant starts at the deadline or before it
    trials = _trials(deadline, clock, taken)
    assert [t.name for t in trials] == ["as given"]  # the partial variant is not judged; the next never starts
    variant_steps = len(taken) - STEPS_NO_WORKERS
    assert variant_steps == int(into_variant) + 1 < STEPS_NO_WORKERS
    assert 0 < clock.now - deadline <= 1.0  # overrun: the one step during which the deadline passed
    assert f"torch_threads=1 is left out of the trials: the deadline passed after {variant_steps} of its" in caplog.text
    assert "non_blocking=True is not tried" in caplog.text


def test_a_variant_the_deadline_passes_in_the_last_step_of_is_kept() -> None:
    clock, taken = FakeClock(), []
    trials = _trials(2 * STEPS_NO_WORKERS - 0.5, clock, taken)
    assert [t.name for t in trials] == ["as given", "torch_threads=1"] and len(taken) == 2 * STEPS_NO_WORKERS
    assert [t.wall_s for t in trials] == [STEPS_NO_WORKERS, STEPS_NO_WORKERS]


def test_the_deadline_stopping_the_loader_as_given_raises_a_timeout_naming_it() -> None:
    clock, taken = FakeClock(), []
    with pytest.raises(TimeoutError, match=r"deadline passed before the loader as given was timed \(.* after 6 of its 1 x 11 steps\)"):
        _trials(5.5, clock, taken)
    assert len(taken) == 6
    # A deadline already past (a duration passed for a time, say) starts nothing.
    clock, taken = FakeClock(now=1000.0), []
    with pytest.raises(TimeoutError, match=r"had passed .* before the loader as given was timed.*not a duration"):
        _trials(60.0, clock, taken)
    assert taken == []


def test_without_a_deadline_every_variant_runs_to_its_end_and_the_clock_is_not_read_per_step() -> None:
    clock, taken = FakeClock(), []
    trials = _trials(None, clock, taken)
    assert [t.name for t in trials] == ["as given", "torch_threads=1", "non_blocking=True"]
    assert len(taken) == 3 * STEPS_NO_WORKERS and [t.wall_s for t in trials] == [STEPS_NO_WORKERS] * 3
    assert clock.reads == 2 * 3  # each trial's start and end, for its wall_s: nothing per step
    # A deadline that never comes times the same steps, at one more clock read per step.
    far, far_taken = FakeClock(), []
    assert [t.name for t in _trials(1e9, far, far_taken)] == [t.name for t in trials]
    assert len(far_taken) == len(taken) and far.reads == clock.reads + len(taken)


def _children() -> set[Any]:
    return set(multiprocessing.active_children())  # also reaps the children that have exited


@pytest.mark.parametrize("persistent", [False, True])
def test_a_variant_with_workers_stopped_by_the_deadline_leaves_no_worker_behind(persistent: bool) -> None:
    before = _children()
    clock, taken, alive = FakeClock(), [], []
    ticking = _ticking(clock, taken)

    def step(batch: Any) -> None:
        ticking(batch)
        alive.append(len(_children() - before))

    variant = LoaderSettings(num_workers=1, persistent_workers=persistent)
    # Persistent workers are timed over 2 epochs: stop it in its second, its pool kept alive across the first.
    into = (STEPS_ONE_WORKER if persistent else 0) + 3.5
    trials = try_loader_settings(_loader(), step, "cpu", settings=[variant], steps_per_epoch=4, epochs=2,
                                 deadline=STEPS_NO_WORKERS + into, clock=clock)
    assert [t.name for t in trials] == ["as given"] and len(taken) == STEPS_NO_WORKERS + int(into) + 1
    assert alive[:STEPS_NO_WORKERS] == [0] * STEPS_NO_WORKERS and alive[STEPS_NO_WORKERS:] == [1] * (int(into) + 1)
    assert _children() - before == set()  # the worker has exited by the time the trials return
