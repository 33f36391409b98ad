"""benchmarks/tune_workloads.py: the comparison's figures (cold compile times amortised, ratios of medians with
their intervals, the table's cells) from hand-made trials, and, in the slow tier, a whole run on a tiny model."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from torch import nn

from ampkit.bench import speedup_interval
from ampkit.tuning import Candidate, Trial
from ampkit.workloads import Workload

pytestmark = pytest.mark.usefixtures("quiet_machine")  # the tune measures differently on a busy machine

START = Candidate(policy="32-true", micro_batch=8, accumulate=1)


@pytest.fixture
def script(load_script: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("tune_workloads", monkeypatch)


def _trial(c: Candidate, times: list[float], compile_s: float | None = None) -> Trial:
    return Trial(key=c.key, stage="compare", candidate=c.to_dict(), step_times_s=times, compile_s=compile_s)


def test_compile_time_amortised_is_each_graphs_first_cold_compile(script: ModuleType) -> None:
    compiled = Candidate(policy="bf16-mixed", micro_batch=8, accumulate=1, compile="model")
    one_thread = Candidate(policy="bf16-mixed", micro_batch=8, accumulate=1, compile="model", threads=1)  # the same graph
    cold, warm = _trial(compiled, [0.010] * 6, compile_s=20.0), _trial(one_thread, [0.010] * 6, compile_s=0.5)
    compiles = script.cold_compiles([warm, cold])
    assert compiles == {compiled.numerics_key: 20.0}
    # A warm-cache trial of that graph is charged the cold compile: 20 s over 1000 steps adds 20 ms a step.
    assert script.amortised(warm, 1000, compiles) == pytest.approx([0.030] * 6)
    assert script.amortised(_trial(START, [0.02] * 6), 1000, compiles) == [0.02] * 6


def test_a_ratio_is_the_reference_median_over_this_one_with_the_benchs_interval(script: ModuleType) -> None:
    ref, mine = [0.020, 0.022, 0.021, 0.019, 0.020, 0.023], [0.010, 0.011, 0.012, 0.010, 0.011, 0.010]
    r = script.ratio(ref, mine)
    assert r["ratio"] == pytest.approx(statistics.median(ref) / statistics.median(mine))
    assert (r["low"], r["high"]) == speedup_interval(ref, mine)
    assert script.fmt_ratio(r) == f"{r['ratio']:.2f}x [{r['low']:.2f}-{r['high']:.2f}]"
    assert script.fmt_ratio({"ratio": 1.0, "same": True}) == "same config" and script.fmt_ratio(None) == "-"


def test_the_table_has_one_row_a_workload_with_the_fastest_hand_combination_and_the_guard(script: ModuleType) -> None:
    x = {"ratio": 1.5, "low": 1.4, "high": 1.6}
    row = {
        "workload": "toy", "tune_s": 42.0, "start_ms": 20.0,
        "tuned": {"change": "precision bf16-true", "status": "ok", "x_start": x, "compile_s": None},
        "best_single": {"change": "precision bf16-true", "status": "ok", "x_start": x},
        "hands": [{"change": "precision bf16-mixed, compile model", "status": "ok", "x_start": {"ratio": 1.2, "low": 1.1, "high": 1.3}},
                  {"change": "precision bf16-true, compile model", "status": "ok", "x_start": {"ratio": 1.3, "low": 1.2, "high": 1.4}}],
        "tuned_vs_single": {"ratio": 1.0, "same": True}, "tuned_vs_hand": {"ratio": 1.15, "low": 1.05, "high": 1.25},
        "guard": {"metric": "accuracy", "gap": 0.003, "noise": 0.008, "tolerance": 0.02, "passed": True},
    }
    lines = script.table([row]).splitlines()
    assert len(lines) == 3 and lines[0].count("|") == lines[2].count("|") == 10
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["toy", "42", "20.0", "precision bf16-true: 1.50x [1.40-1.60]", "precision bf16-true: 1.50x [1.40-1.60]",
                     "precision bf16-true, compile model: 1.30x [1.20-1.40]", "same config", "1.15x [1.05-1.25]",
                     "+0.003 accuracy (0.008, 0.02)"]


def test_unknown_workloads_are_refused_with_the_choices(script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["tune_workloads.py", "--workloads", "digts"])
    with pytest.raises(SystemExit):
        script.main()
    assert "choose from digits, digits-aug, segment, gpt, resnet, hf-gpt2" in capsys.readouterr().err


# CI time (2026-11-28): slow tier (a tune and two waves, compiles included: about a minute). CI checks the
# comparison's figures above and the tune itself in tests/unit/tuning.
@pytest.mark.slow
def test_a_whole_comparison_on_a_tiny_model_ranks_what_it_measured(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def tiny(name: str, seed: int) -> tuple[Workload, None]:
        g = torch.Generator().manual_seed(seed)
        batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(40)]
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        return Workload(name=name, model=model, train_batches=batches, items_per_batch=8, steps=30, warmup=2), None

    monkeypatch.setattr(script, "build", tiny)
    monkeypatch.setattr(script, "fast_policies", lambda: ["bf16-mixed"])
    row = script.compare("tiny", 120.0, 1000, 0, sys.stderr)
    assert row["tuned"]["status"] == "ok" and row["start_ms"] > 0
    assert row["guard"]["passed"] and row["tune_s"] < 120 + 30  # the budget, and at most one step or compile beyond
    assert {h["change"] for h in row["hands"]} == {"precision bf16-mixed, compile model"}
