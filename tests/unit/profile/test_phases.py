"""PhaseTimer against controls: a known delay put into one part of the loop shows up in that phase, and only there."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.profile import PHASES, PhaseTimer

# Seconds, slept (the same on a loaded machine): far above the phases' own few milliseconds, the timer's resolution
# and the scheduler's delays when another process shares the cores (at 30 ms, under pytest -n 2 on 2 cores, a tiny
# forward's median once came out 12 ms long).
DELAY = 0.1


def _loop(steps: int = 6, *, data_delay: float = 0.0, forward_delay: float = 0.0, accumulate: int = 1) -> PhaseTimer:
    torch.manual_seed(0)
    timer = PhaseTimer()
    engine = Engine(accumulate=accumulate, hooks=[timer])
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters()))
    for _ in range(steps * accumulate):
        time.sleep(data_delay)  # the batch is late: a slow dataset
        x = torch.randn(32, 64)
        with engine.autocast():
            if forward_delay:
                time.sleep(forward_delay)  # a slow forward
            loss = model(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    return timer


def _median(timer: PhaseTimer, phase: str) -> float:
    return statistics.median(s.phases[phase] for s in timer.steps())


def test_every_step_after_the_first_is_split_into_phases_that_add_up() -> None:
    steps = _loop(5).steps()
    assert len(steps) == 4 and all(s.steps == 1 for s in steps)
    for s in steps:
        assert set(s.phases) == set(PHASES) and all(v >= 0 for v in s.phases.values())
        assert sum(s.phases.values()) == pytest.approx(s.total)
        assert s.phases["forward"] > 0 and s.phases["backward"] > 0 and s.phases["optimizer"] > 0


def test_a_late_batch_is_data_time_and_nothing_else() -> None:
    plain, slow = _loop(), _loop(data_delay=DELAY)
    assert _median(slow, "data") - _median(plain, "data") == pytest.approx(DELAY, abs=0.4 * DELAY)
    for phase in ("forward", "backward", "optimizer"):
        assert abs(_median(slow, phase) - _median(plain, phase)) < 0.3 * DELAY, phase


def test_a_slow_forward_is_forward_time_and_nothing_else() -> None:
    plain, slow = _loop(), _loop(forward_delay=DELAY)
    assert _median(slow, "forward") - _median(plain, "forward") == pytest.approx(DELAY, abs=0.4 * DELAY)
    assert abs(_median(slow, "data") - _median(plain, "data")) < 0.3 * DELAY


def test_a_window_of_micro_batches_is_one_step() -> None:
    timer = _loop(4, data_delay=DELAY, accumulate=2)
    steps = timer.steps()
    assert len(steps) == 3
    # Both micro-batches' waits are the step's data time.
    assert statistics.median(s.phases["data"] for s in steps) == pytest.approx(2 * DELAY, abs=0.8 * DELAY)


def test_device_time_needs_a_cuda_run() -> None:
    with pytest.raises(ValueError, match="CUDA run"):
        _loop(2).steps(device_time=True)


def test_fed_through_batches_the_loaders_wait_is_data_and_the_loops_own_code_is_other() -> None:
    def run(*, loader_delay: float, loop_delay: float) -> PhaseTimer:
        timer = PhaseTimer()
        engine = Engine(hooks=[timer])
        model = nn.Linear(64, 1)
        model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))

        def loader():
            for _ in range(6):
                time.sleep(loader_delay)  # the DataLoader's wait
                yield torch.randn(32, 64)

        for x in timer.batches(loader(), "cpu"):
            with engine.autocast():
                loss = model(x).pow(2).mean()
            engine.backward(loss)
            engine.step()
            time.sleep(loop_delay)  # the loop's own code after the step: logging, a read-back
        return timer

    plain, late, busy = run(loader_delay=0, loop_delay=0), run(loader_delay=DELAY, loop_delay=0), run(loader_delay=0, loop_delay=DELAY)
    assert _median(late, "data") - _median(plain, "data") == pytest.approx(DELAY, abs=0.4 * DELAY)
    assert abs(_median(late, "other") - _median(plain, "other")) < 0.3 * DELAY
    assert _median(busy, "other") - _median(plain, "other") == pytest.approx(DELAY, abs=0.4 * DELAY)
    assert abs(_median(busy, "data") - _median(plain, "data")) < 0.3 * DELAY


def test_the_copy_is_its_own_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampkit.profile import _phases as phases

    def slow_copy(batch, device, channels_last=False, *, non_blocking=False):
        time.sleep(DELAY)  # a copy that takes time, as a host-to-device copy of a large batch does
        return batch

    monkeypatch.setattr(phases, "to_device", slow_copy)
    timer = PhaseTimer()
    engine = Engine(hooks=[timer])
    model = nn.Linear(8, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x in timer.batches([torch.ones(2, 8)] * 5, "cpu"):
        engine.backward(model(x).sum())  # no autocast: the phase up to the backward is "other"
        engine.step()
    assert _median(timer, "copy") == pytest.approx(DELAY, abs=0.4 * DELAY)
    assert _median(timer, "data") < 0.3 * DELAY
