"""benchmarks/tune_busy.py: what the table says of the machine, its cells, and a run beside a CPU-bound process that
is refused for its budget and leaves no process behind."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from ampkit.tuning import Candidate, TuneResult

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "tune_busy.py"
START = Candidate(policy="32-true", micro_batch=8, accumulate=1)


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # it imports tune_workloads' workloads from beside it
    return load_script("tune_busy", monkeypatch)


def _result(machine: dict[str, object], waves: list[dict[str, object]]) -> TuneResult:
    return TuneResult(workload="w", description="", device={}, unit="samples", items_per_step=8, run_steps=1, budget_s=60, start=START,
                      baseline=START, winner=START, machine=machine, waves=waves)


def test_what_the_report_said_of_the_machine(script: ModuleType) -> None:
    busy = _result({"busy_at_probe": True, "oversubscribed": True, "free_threads": 1},
                   [{"others_cores": 1.2, "dropped_rounds": 2, "disturbed": False}, {"others_cores": 1.1, "dropped_rounds": 1, "disturbed": True}])
    assert script.machine_said(busy) == "busy, free threads 1, dropped 3, disturbed 1"
    assert script.machine_said(_result({"busy_at_probe": False}, [{"others_cores": 0.0, "dropped_rounds": 0}])) == "-"
    # Busy during a wave though quiet at the probe: still said.
    assert script.machine_said(_result({"busy_at_probe": False}, [{"others_cores": 0.7, "dropped_rounds": 0}])) == "busy"


def test_the_rows_cells(script: ModuleType) -> None:
    won = {"workload": "gpt", "budget": 90.0, "load": 2, "tune_s": 91.4, "rows": 5, "winner": "precision bf16-true", "speedup": 1.5,
           "interval": (1.4, 1.6), "rounds": 6, "machine": "busy"}
    assert script.fmt(won) == "| gpt | 90 | loaded | 91 | 1.4 | 5 | precision bf16-true: 1.50x [1.40-1.60], 6 rounds | busy |"
    refused = {"workload": "gpt", "budget": 60.0, "load": 0, "tune_s": 5.2, "refused": 135, "error": "--budget 60 s is too small"}
    assert script.fmt(refused) == "| gpt | 60 | quiet | 5 | 0 | - | refused: 135 s | - |"


def test_a_loaded_run_too_small_for_its_budget_is_refused_and_its_load_stopped(script: ModuleType) -> None:
    row = script.one("tiny-gpt", budget=1.0, load=1, run_steps=1000, seed=0)
    assert row["refused"] is not None and row["refused"] > 1 and "too small for the least useful answer" in row["error"]
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]
