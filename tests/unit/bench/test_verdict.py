"""Verdicts against the fp32 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ampkit.bench.results import BenchResult, RunResult
from ampkit.bench.verdict import FEW_EVAL_SAMPLES, Tolerance, apply_verdicts, check_tolerance

ACC = Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False)
PPL = Tolerance("perplexity", higher_is_better=False, tolerance=0.02, relative=True)


def _times(median: float, spread: float = 0.01, n: int = 21) -> list[float]:
    """``n`` step times evenly spread ``spread`` either side of ``median`` (so ``median`` is their median)."""
    return (median * (1 + spread * np.linspace(-1, 1, n))).tolist()


def _run(precision: str, median: float, spread: float = 0.01, **kw: object) -> RunResult:
    return RunResult(precision=precision, step_time_median_s=median, step_times_s=_times(median, spread), **kw)  # type: ignore[arg-type]


def _ref(spread: float = 0.01, **kw: object) -> RunResult:
    return _run("32-true", 0.010, spread, peak_memory_bytes=1000, eval_metric=0.90, **kw)


def test_speedup_memory_and_tolerance_are_measured_against_the_reference() -> None:
    run = _run("bf16-mixed", 0.004, peak_memory_bytes=700, eval_metric=0.885)
    result = BenchResult(workload="w", runs=[_ref(), run])
    apply_verdicts(result, ACC)
    assert math.isclose(run.speedup_vs_fp32, 2.5) and math.isclose(run.memory_saved_vs_fp32, 0.3)
    assert run.within_tolerance is True
    assert 1.0 < run.speedup_low < 2.5 < run.speedup_high
    interval = f"{run.speedup_low:.2f}–{run.speedup_high:.2f}x"
    assert run.verdict == f"bf16-mixed: 2.50x faster ({interval}), 30% less memory, accuracy 0.885 within 0.02 of 32-true (0.9): pays on this model and device"
    assert result.eval_tolerance == "accuracy within 0.02 of 32-true"
    assert result.runs[0].verdict == "32-true: the fp32 reference" and result.runs[0].speedup_vs_fp32 == 1.0


def test_faster_but_less_accurate_does_not_pay() -> None:
    run = RunResult(precision="bf16-true", step_time_median_s=0.005, peak_memory_bytes=500, eval_metric=0.80)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), run]), ACC)
    assert run.within_tolerance is False
    assert "OUTSIDE 0.02" in run.verdict and run.verdict.endswith("does not pay on this model and device")


def test_slower_and_same_memory_does_not_pay_and_small_differences_read_as_same_speed() -> None:
    slow = _run("16-mixed", 0.09, peak_memory_bytes=1000, eval_metric=0.9)
    same = _run("tf32", 0.0099, peak_memory_bytes=1000, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), slow, same]), ACC)
    assert slow.verdict.startswith("16-mixed: 9.00x slower (8.9") and slow.verdict.endswith("does not pay on this model and device")
    assert same.verdict.startswith("tf32: as fast (1.01x; 1.00–1.02x), same memory")


def test_slower_but_leaner_trades_speed_for_memory_and_as_fast_but_leaner_pays() -> None:
    slow = _run("16-mixed", 0.3, peak_memory_bytes=800, eval_metric=0.9)
    level = _run("bf16-true", 0.0101, peak_memory_bytes=500, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), slow, level]), ACC)
    assert slow.verdict.startswith("16-mixed: 30.00x slower (29.")
    assert ", 20% less memory" in slow.verdict
    assert slow.verdict.endswith("trades speed for memory on this model and device")
    assert level.verdict.endswith(": pays on this model and device")


def test_relative_tolerance_for_lower_is_better_metrics() -> None:
    ref = RunResult(precision="32-true", step_time_median_s=0.01, peak_memory_bytes=10, eval_metric=10.0)
    near = RunResult(precision="bf16-mixed", step_time_median_s=0.01, peak_memory_bytes=10, eval_metric=10.19)
    far = RunResult(precision="bf16-true", step_time_median_s=0.01, peak_memory_bytes=10, eval_metric=10.25)
    apply_verdicts(BenchResult(workload="w", runs=[ref, near, far]), PPL)
    assert (near.within_tolerance, far.within_tolerance) == (True, False)
    assert "within 2% of 32-true" in near.verdict


def test_failed_and_diverged_runs() -> None:
    failed = RunResult(precision="16-true", status="failed", error="RuntimeError: boom")
    diverged = RunResult(precision="16-mixed", status="diverged", step_time_median_s=0.01, peak_memory_bytes=800, eval_metric=float("nan"))
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), failed, diverged]), ACC)
    assert failed.verdict == "16-true: failed: RuntimeError: boom" and failed.speedup_vs_fp32 is None
    assert diverged.within_tolerance is False and "diverged" in diverged.verdict


def test_without_a_working_reference_nothing_is_compared() -> None:
    broken = RunResult(precision="32-true", status="failed", error="OOM")
    run = RunResult(precision="bf16-mixed", step_time_median_s=0.01)
    apply_verdicts(BenchResult(workload="w", runs=[broken, run]), None)
    assert run.speedup_vs_fp32 is None and "no 32-true reference" in run.verdict


def test_a_speedup_whose_interval_holds_one_is_inconclusive_not_pays() -> None:
    # Same medians (6% faster) twice: steady step times make it a finding, scattered ones (±40%) do not.
    steady, noisy = _run("bf16-mixed", 0.010 / 1.06), _run("bf16-mixed", 0.010 / 1.06, spread=0.4)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), steady]), None)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(spread=0.4), noisy]), None)
    assert math.isclose(steady.speedup_vs_fp32, 1.06) and math.isclose(noisy.speedup_vs_fp32, 1.06)
    assert 1.0 < steady.speedup_low < 1.06 < steady.speedup_high
    assert noisy.speedup_low < 1.0 < noisy.speedup_high
    assert steady.verdict.endswith(": pays on this model and device")
    assert ": inconclusive on this model and device (the speed-up is within the step-time noise" in noisy.verdict


def test_too_few_timed_steps_give_no_interval_and_no_speed_claim() -> None:
    run = RunResult(precision="bf16-mixed", step_time_median_s=0.005, step_times_s=[0.005] * 3)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), run]), None)
    assert run.speedup_low is None and run.speedup_high is None
    assert run.verdict.startswith("bf16-mixed: 2.00x faster: inconclusive on this model and device (too few timed steps")


def test_leaner_and_slower_within_the_noise_is_inconclusive() -> None:
    steady, noisy = _run("16-mixed", 0.012, peak_memory_bytes=500), _run("16-mixed", 0.012, spread=0.4, peak_memory_bytes=500)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), steady]), None)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(spread=0.4), noisy]), None)
    assert steady.speedup_high < 1.0 and steady.verdict.endswith("trades speed for memory on this model and device")
    assert steady.verdict.startswith("16-mixed: 1.20x slower (1.1")  # the interval in "slower" factors too
    assert noisy.speedup_low < 1.0 < noisy.speedup_high
    assert ": inconclusive on this model and device (it saves memory, but the slow-down is within the step-time noise" in noisy.verdict


def test_a_metric_from_a_handful_of_eval_samples_says_so() -> None:
    few, enough = FEW_EVAL_SAMPLES - 1, FEW_EVAL_SAMPLES
    for samples, flagged in ((few, True), (enough, False), (None, False)):
        run = _run("bf16-mixed", 0.005, eval_metric=0.89)
        result = BenchResult(workload="w", runs=[_ref(), run], eval_samples=samples)
        apply_verdicts(result, ACC)
        assert (f"of 32-true (0.9) on only {few} eval samples:" in run.verdict) is flagged, run.verdict
        assert (f"(on only {few} eval samples" in (result.eval_tolerance or "")) is flagged


def test_a_tolerance_override_decides_within_and_keeps_the_metric_kind() -> None:
    run = _run("bf16-mixed", 0.005, eval_metric=0.89)  # 0.01 below the reference's 0.90
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), run]), ACC.with_amount(0.005))
    assert run.within_tolerance is False and "OUTSIDE 0.005 of 32-true" in run.verdict
    assert PPL.with_amount(0.1).relative and PPL.with_amount(0.1).describe("32-true") == "perplexity within 10% of 32-true"


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf"), "abc", None, True])
def test_a_tolerance_must_be_a_non_negative_finite_number(bad: object) -> None:
    with pytest.raises(ValueError, match=r"must be a non-negative finite number .*e\.g\. 0\.01"):
        check_tolerance(bad)
    with pytest.raises(ValueError, match="non-negative finite"):
        ACC.with_amount(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Tolerance\('accuracy'\)\.tolerance must be"):
        Tolerance("accuracy", True, bad, relative=False)  # type: ignore[arg-type]


def _weights_runs(**metrics: float) -> list[RunResult]:
    peaks = {"bf16-mixed": 900, "bf16-true": 500, "bf16-true-remainder": 600, "bf16-true-masters": 800}
    return [_ref()] + [_run(p, 0.008, peak_memory_bytes=peaks[p], eval_metric=m) for p, m in metrics.items()]


def test_the_recovery_verdict_names_the_leanest_16_bit_weights_policy_that_recovers_fp32s_metric() -> None:
    result = BenchResult(workload="w", runs=_weights_runs(**{"bf16-mixed": 0.9, "bf16-true": 0.80, "bf16-true-remainder": 0.895, "bf16-true-masters": 0.90}))
    apply_verdicts(result, ACC)
    assert result.recovery is not None
    assert result.recovery.startswith("16-bit weights: bf16-true loses 32-true's accuracy (0.8 vs 0.9)")
    assert "bf16-true-remainder, bf16-true-masters recover it" in result.recovery
    assert "the leanest that does: bf16-true-remainder (peak 600 B; bf16-true-masters 800 B)" in result.recovery
    assert "bf16-mixed" not in result.recovery  # fp32 weights: judged by its own verdict only


def test_the_recovery_verdict_says_when_none_recovers_and_stays_silent_without_a_comparison() -> None:
    lost = BenchResult(workload="w", runs=_weights_runs(**{"bf16-true": 0.80, "bf16-true-remainder": 0.85}))
    apply_verdicts(lost, ACC)
    assert lost.recovery is not None and "none recovers it: keep fp32 weights" in lost.recovery
    alone = BenchResult(workload="w", runs=_weights_runs(**{"bf16-mixed": 0.9, "bf16-true": 0.80}))
    apply_verdicts(alone, ACC)
    assert alone.recovery is None  # one 16-bit-weights run: its own verdict says it
    untold = BenchResult(workload="w", runs=_weights_runs(**{"bf16-true": 0.80, "bf16-true-masters": 0.9}))
    apply_verdicts(untold, None)
    assert untold.recovery is None
