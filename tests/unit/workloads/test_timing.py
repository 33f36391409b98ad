"""Step timing and its summary."""

from __future__ import annotations

import time

import pytest
import torch

from ampkit.workloads._timing import StepTimer, summarize


def test_cpu_timer_records_each_step_and_flush_empties_it() -> None:
    timer = StepTimer(torch.device("cpu"))
    for delay in (0.002, 0.004):
        with timer.step():
            time.sleep(delay)
    times = timer.flush()
    assert len(times) == 2 and times[0] >= 0.002 and times[1] >= 0.004
    assert timer.flush() == []


def test_summary_is_median_and_deciles() -> None:
    stats = summarize([float(i) for i in range(1, 12)])  # 1..11
    assert stats == {"median": 6.0, "p10": 2.0, "p90": 10.0}
    assert summarize([0.5]) == {"median": 0.5, "p10": 0.5, "p90": 0.5}


def test_summary_of_nothing_says_how_to_get_timed_steps() -> None:
    with pytest.raises(ValueError, match="--steps"):
        summarize([])


@pytest.mark.gpu
def test_cuda_timer_measures_the_kernels_not_the_launches(device: torch.device) -> None:
    timer = StepTimer(device)
    a = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with timer.step():
        for _ in range(20):
            a = a @ a / 64  # ~2.7 TFLOP in fp32: tens of milliseconds of GPU work, microseconds to launch
    launch = time.perf_counter() - t0
    (elapsed,) = timer.flush()
    assert elapsed > 5 * launch
