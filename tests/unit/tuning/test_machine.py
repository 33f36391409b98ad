"""The machine's load: other processes' CPU time from the kernel's counters, and the control's drift between rounds."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from ampkit._util import cpu_load as _machine  # the meter the tune imports lives below it, shared with the profile
from ampkit.tuning._machine import ROUND_DRIFT, CpuMeter, Load, control_drift

pytestmark = pytest.mark.real_load  # the meter itself, not the quiet machine the tune's other tests see


def test_other_processes_cpu_time_is_the_machines_less_this_processs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Over 2 s the CPUs ran 700 ticks (100 a second each), this process 300 of them: the others took 400 ticks, 2 cores.
    busy, own, now = iter([1000.0, 1700.0]), iter([50.0, 350.0]), iter([10.0, 12.0])
    monkeypatch.setattr(_machine, "_machine_busy_ticks", lambda: next(busy))
    monkeypatch.setattr(_machine, "_own_ticks", lambda: next(own))
    monkeypatch.setattr(_machine, "_ticks_per_second", lambda: 100.0)
    meter = CpuMeter(clock=lambda: next(now), cores=4)
    meter.mark()
    load = meter.read()
    assert load == Load(2.0, 2.0, 4) and load.busy


def test_where_the_os_does_not_say_the_load_is_unknown_and_not_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_machine, "_machine_busy_ticks", lambda: None)
    load = CpuMeter().read()
    assert load.others_cores is None and not load.busy and load.describe() == "the OS does not say how busy the machine is"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_process_spinning_beside_this_one_is_seen() -> None:
    # (That this process's own work is not counted is the arithmetic test's: the real counters of a machine running
    # other tests cannot show it.)
    if CpuMeter().read().others_cores is None:
        pytest.skip("no /proc/stat here: the OS does not say")
    child = multiprocessing.get_context("spawn").Process(target=_spin, args=(1.5,))
    child.start()
    time.sleep(0.5)  # the child's interpreter starting
    meter = CpuMeter()
    meter.mark()
    time.sleep(0.8)
    beside = meter.read()
    child.join()
    # The child spins a whole core; on a machine busy with other work it gets less, but not under a third of one.
    assert beside.others_cores is not None and beside.others_cores >= 0.3


def test_a_round_whose_control_moved_is_named_and_steady_noise_is_not() -> None:
    # A machine that changed pace under the wave (44 ms, then 542): the rounds at the new pace moved.
    assert control_drift([[0.044] * 3, [0.045] * 3, [0.542] * 3, [0.044] * 3])[1] == [2]
    # Steps noisy alike in every round (a thread sharing its core): rounds differ as much as steps do; none moved.
    noisy = [[0.07, 0.15, 0.08], [0.15, 0.07, 0.14], [0.08, 0.15, 0.07], [0.14, 0.15, 0.07]]
    drift, moved = control_drift(noisy)
    assert moved == [] and drift > ROUND_DRIFT
    # Quiet steps: a 30% move is beyond the drift a round may show.
    assert control_drift([[0.100, 0.101], [0.099, 0.100], [0.130, 0.131]])[1] == [2]
