"""A disturbed profile is said, not printed as plain figures: the machine's load (the measure ``ampkit tune`` reads)
over the steps and the trials, the decision on recorded loads, and a live CPU-bound process beside a short profile."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from ampkit import Engine
from ampkit._util import cpu_load
from ampkit._util.cpu_load import BUSY_CORES, CpuMeter, Load
from ampkit.profile import Profiler
from ampkit.profile._disturbed import disturbed_line, load_record
from ampkit.profile._report import render_report
from ampkit.profile._table import overhead_line, render

pytestmark = pytest.mark.real_load  # the machine's real load


def _render(data: dict[str, Any]) -> str:
    console = Console(file=io.StringIO(), width=200)
    render(data, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _with_load(data: dict[str, Any], steps: Load, trials: Load | None = None) -> dict[str, Any]:
    data["machine"] = {"steps": load_record(steps), "trials": load_record(trials) if trials is not None else None}
    return data


# Recorded loads: two CPU-bound processes beside the profile on the 2-core machine (1.9 cores), CI's usual
# background (0.2), just under and at the threshold.
@pytest.mark.parametrize(("others", "flagged"), [(1.9, True), (BUSY_CORES, True), (BUSY_CORES - 0.01, False), (0.2, False), (None, False)])
def test_a_run_is_disturbed_from_the_tunes_threshold_on(profile_data: dict[str, Any], others: float | None, flagged: bool) -> None:
    data = _with_load(profile_data, Load(others, 3.0, 2))
    line = disturbed_line(data)
    assert (line is not None) is flagged
    text, report = _render(data), render_report(data)
    overhead = overhead_line(data)
    assert overhead is not None
    if flagged:
        assert line is not None and f"took {others:.1f} of the 2 cores" in line and "not the loop's own" in line
        assert "Disturbed run" in text and "Disturbed run" in report
        assert "not read" in overhead and "1.07x" not in overhead and "1.07x" not in text  # no ratio passed as the cost
    else:
        assert "Disturbed" not in text and "Disturbed" not in report and "1.07x" in overhead


def test_busy_trials_on_a_quiet_step_window_are_said_apart(profile_data: dict[str, Any]) -> None:
    data = _with_load(profile_data, Load(0.1, 3.0, 2), Load(1.2, 5.0, 2))
    line = disturbed_line(data)
    assert line is not None and line.startswith("Disturbed trials") and "speed-ups" in line
    assert "1.07x" in (overhead_line(data) or "")  # the steps were quiet: their overhead is read


def test_a_ratio_far_below_one_with_a_wild_spread_is_not_printed_as_the_overhead(profile_data: dict[str, Any]) -> None:
    # The run the issue met: steps so noisy that p90 - p10 exceeded the median, a timed window at 0.06x of the plain.
    profile_data["step_s"].update(median=0.6, p10=0.05, p90=1.4)
    profile_data["overhead"].update(plain_step_s=10.0, profiled_step_s=0.6, sync_step_s=None, trace_step_s=None)
    line = overhead_line(profile_data)
    assert line is not None and "not read" in line and "0.06x" not in line


def test_the_loops_own_loader_workers_count_as_its_own_not_as_other_processes() -> None:
    if CpuMeter().read().others_cores is None:
        pytest.skip("no /proc/stat here: the OS does not say")
    # A live child (a DataLoader worker) spinning: counted as this process's with children=True, as another's without.
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 1.6\nwhile time.monotonic() < end: pass"])
    try:
        time.sleep(0.4)  # the interpreter starting
        family, alone = CpuMeter(children=True), CpuMeter()
        family.mark()
        alone.mark()
        time.sleep(0.8)
        with_family, without = family.read(), alone.read()
    finally:
        child.wait()
    assert without.others_cores is not None and with_family.others_cores is not None
    # The child spins up to a core: the meter that counts it as this process's sees that much less of the others.
    assert without.others_cores - with_family.others_cores >= 0.3


def test_children_ticks_sum_the_live_childrens_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    busy, own, kids, now = iter([1000.0, 1700.0]), iter([50.0, 150.0]), iter([10.0, 210.0]), iter([10.0, 12.0])
    monkeypatch.setattr(cpu_load, "_machine_busy_ticks", lambda: next(busy))
    monkeypatch.setattr(cpu_load, "_own_ticks", lambda: next(own))
    monkeypatch.setattr(cpu_load, "_children_ticks", lambda: next(kids))
    monkeypatch.setattr(cpu_load, "_ticks_per_second", lambda: 100.0)
    meter = CpuMeter(clock=lambda: next(now), cores=4, children=True)
    meter.mark()
    # 700 ticks in 2 s, 100 this process's, 200 its children's: the others took 400 ticks, 2 cores.
    assert meter.read() == Load(2.0, 2.0, 4)


# The launcher starts the spinner and exits at once, so the spinner is not this process's child: the profile counts
# its own children (a DataLoader's workers) as its own load, and a child spinner read as no disturbance at all on a
# quiet machine (CI, 2026-12-06: 0.02 cores of others). The spinner holds none of the launcher's pipes (run() waits
# for them to close); the launcher prints its pid.
_LAUNCH = ("import subprocess, sys\n"
           "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], stdin=subprocess.DEVNULL, "
           "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)\n"
           "print(p.pid, flush=True)")


@pytest.fixture
def spinner() -> Iterator[int]:
    """A CPU-bound process beside the test (not its child), spinning a core until killed; yields its pid once it runs."""
    launcher = subprocess.run([sys.executable, "-c", _LAUNCH], capture_output=True, text=True, timeout=60, check=True)
    pid = int(launcher.stdout.split()[0])
    try:
        deadline = time.monotonic() + 30
        while _state(pid) != "R" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # past the interpreter's start: spinning
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    """The process's state letter from /proc (R: running), or '' where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.rindex(")") + 2]


def test_a_profile_beside_a_cpu_bound_process_names_the_disturbance(spinner: int) -> None:
    if CpuMeter().read().others_cores is None:
        pytest.skip("no /proc/stat here: the OS does not say")
    # One-sided: the machine the tests run on is not quiet either, so a run without the spinner may be flagged too.
    engine = Engine()
    model = nn.Linear(8, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.ones(4, 8)
    with Profiler(engine, warmup=1, plain_steps=10, timed=10, sync_steps=0, trace_steps=0) as profiler:
        for batch in profiler.batches([x] * 21):
            with engine.autocast():
                loss = model(batch).sum()
            engine.backward(loss)
            engine.step()
            time.sleep(0.02)  # 0.4 s in all: enough of the kernel's 100 Hz ticks to read a spinning core
    data = profiler.result()
    assert data["machine"]["steps"]["others_cores"] >= BUSY_CORES
    text = _render(data)
    assert "Disturbed run" in text and "Profiler overhead not read" in text
