"""A lever that changes only scheduling (torch's threads, the DataLoader's settings), not the arithmetic, needs no
accuracy guard: a gain measured there is kept with no guard run, whatever the budget has left, and the table says
``same arithmetic``. A lever that changes the arithmetic (a policy) is still guarded."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from ampkit.tuning import Candidate, GuardResult, Trial, rows, tune_workload
from ampkit.tuning._report import render
from ampkit.tuning._trials import WaveSettings
from ampkit.workloads import Accuracy, Workload

ROWS = 16
FAST = {"waves": WaveSettings(rounds=2, chunk=3, warmup=1), "guard_steps": 6, "precisions": ["bf16-mixed"]}
START = "32-true mb16x1 compile=off"


def _workload() -> Workload:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(ROWS, 8, generator=g), torch.randint(0, 3, (ROWS,), generator=g)) for _ in range(4)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    return Workload(name="mlp", model=model, train_batches=batches, eval_batches=batches[:1], metric=Accuracy,
                    items_per_batch=ROWS, steps=6, warmup=1)


def _fake(monkeypatch: pytest.MonkeyPatch, medians: dict[str, float], threads: int = 2) -> list[str]:
    """Stand-in waves (each configuration's steps jitter around ``medians[key]``, else 10 ms) and guard runs that
    are recorded, not trained; the probe on a quiet machine of ``threads`` cores. Returns what the guard trained."""
    from ampkit.tuning import _run, _tune
    from ampkit.tuning._machine import Load
    from ampkit.tuning._run import Probe

    guarded: list[str] = []

    def times(median: float, i: int) -> list[float]:
        return [median * (1 + 0.01 * ((i + k) % 5 - 2)) for k in range(12)]

    def wave(workload: Workload, stage: str, baseline: Candidate, members: list[Candidate], *a: Any, incumbent: Candidate | None = None, **kw: Any) -> Any:
        base = times(0.010, 0)
        wave_of = list(dict.fromkeys(([incumbent] if incumbent is not None and incumbent != baseline else []) + list(members)))
        out = [Trial(key=c.key, stage=stage, candidate=c.to_dict(), role="incumbent" if c == incumbent else "candidate",
                     step_times_s=times(medians.get(c.key, 0.010), i + 1), baseline_times_s=base) for i, c in enumerate(wave_of)]
        return out + [Trial(key=baseline.key, stage=stage, candidate=baseline.to_dict(), role="baseline", step_times_s=base, baseline_times_s=base)]

    def reference(workload: Workload, start: Candidate, *a: Any, **kw: Any) -> Any:
        from ampkit.tuning._guard import Reference

        guarded.append(f"reference {start.key}")
        return Reference("accuracy", True, 0.9, 0.9, 0.02, 6, [1.0] * 6, [1.0] * 6)

    def judge(workload: Workload, c: Candidate, ref: Any, *a: Any, **kw: Any) -> GuardResult:
        guarded.append(c.key)
        return GuardResult(c.numerics_key, "accuracy", True, 0.9, 0.9, 0.0, 0.02)

    monkeypatch.setattr(_tune, "measure_wave", wave)
    monkeypatch.setattr(_tune, "reference", reference)
    monkeypatch.setattr(_tune, "judge", judge)
    monkeypatch.setattr(_run, "_probe", lambda *a: Probe(0.010, 1.0, Load(0.0, 1.0, 2)))
    monkeypatch.setattr("ampkit.tuning._facts.usable_cores", lambda: threads)
    return guarded


@pytest.fixture
def two_threads() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_threads_gain_is_kept_with_no_guard_run_and_the_table_says_same_arithmetic(monkeypatch: pytest.MonkeyPatch, two_threads: None) -> None:
    # Before: the threads winner trained the fp32 reference twice to pass a guard that could not fail.
    one = f"{START} threads=1"
    guarded = _fake(monkeypatch, {one: 0.006})
    result = tune_workload(_workload(), "cpu", budget=300, stages=["threads"], **FAST)  # type: ignore[arg-type]
    assert result.winner.key == one and guarded == []
    assert "changes only scheduling (threads, the DataLoader), not what is computed: it needs no accuracy guard" in result.winner_reason
    row = next(r for r in rows(result) if r["key"] == one)
    assert row["verdict"] == "winner" and row["gap"] is None and row["same_arithmetic"]
    console = Console(record=True, width=300)
    render(result, console)
    assert "same arithmetic" in console.export_text()


def test_a_tune_of_threads_alone_keeps_no_time_for_a_guard_and_its_gain_needs_none(monkeypatch: pytest.MonkeyPatch, two_threads: None) -> None:
    # Before: a guard run was priced in (here, at a day each): the tune was refused as too small for its budget,
    # and a threads winner at the end without time for a guard was "not guarded ..., so not recommended".
    from ampkit.tuning._budget import Budget

    one = f"{START} threads=1"
    guarded = _fake(monkeypatch, {one: 0.006})
    monkeypatch.setattr(Budget, "guard_s", lambda self, c, steps: 86400.0)
    result = tune_workload(_workload(), "cpu", budget=300, stages=["threads"], **FAST)  # type: ignore[arg-type]
    assert result.winner.key == one and guarded == []
    assert not any("not guarded" in n for n in result.notes)


def test_a_tune_that_may_change_the_arithmetic_still_keeps_its_guards_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampkit.tuning._budget import Budget

    _fake(monkeypatch, {})
    monkeypatch.setattr(Budget, "guard_s", lambda self, c, steps: 86400.0)
    with pytest.raises(ValueError, match="too small for the least useful answer"):
        tune_workload(_workload(), "cpu", budget=300, stages=["precision", "threads"], **FAST)  # type: ignore[arg-type]


def test_a_loader_gain_on_top_of_a_threads_gain_is_kept_with_no_guard_run(monkeypatch: pytest.MonkeyPatch, two_threads: None) -> None:
    from ampkit.profile import LoaderSettings, Trial as LoaderTrial

    def loader_trials(loader: Any, step: Any, device: Any, **kw: Any) -> list[Any]:
        step(next(iter(loader)))
        return [LoaderTrial(LoaderSettings(), "as given", 0.010, 0.010, 0.0, speedup=1.0, baseline=True),
                LoaderTrial(LoaderSettings(num_workers=1), "num_workers=1", 0.005, 0.005, 0.0, speedup=2.0)]

    one = f"{START} threads=1"
    guarded = _fake(monkeypatch, {one: 0.006})
    monkeypatch.setattr("ampkit.tuning._facts.loader_variants", lambda loader, device: [{"num_workers": 1}])
    monkeypatch.setattr("ampkit.tuning._loader_stage.try_loader_settings", loader_trials)
    w = _workload()
    loader = torch.utils.data.DataLoader(list(zip(torch.randn(4 * ROWS, 8), torch.randint(0, 3, (4 * ROWS,)))), batch_size=ROWS)
    w.train_batches = list(loader)
    result = tune_workload(w, "cpu", budget=300, loader=loader, stages=["loader", "threads"], **FAST)  # type: ignore[arg-type]
    assert result.winner.threads == 1 and result.winner.loader == (("num_workers", 1),) and guarded == []


def test_a_policy_gain_is_still_guarded_against_the_fp32_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    mixed = "bf16-mixed mb16x1 compile=off"
    guarded = _fake(monkeypatch, {mixed: 0.006})
    result = tune_workload(_workload(), "cpu", budget=300, stages=["precision"], **FAST)  # type: ignore[arg-type]
    assert result.winner.key == mixed and guarded == [f"reference {START}", mixed]
    assert "passed the accuracy guard" in result.winner_reason
    row = next(r for r in rows(result) if r["key"] == mixed)
    assert row["gap"] == 0.0 and not row["same_arithmetic"]
