"""Verdicts against the fp32 reference."""

from __future__ import annotations

import math

from ampkit.bench.results import BenchResult, RunResult
from ampkit.bench.verdict import Tolerance, apply_verdicts

ACC = Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False)
PPL = Tolerance("perplexity", higher_is_better=False, tolerance=0.02, relative=True)


def _ref(**kw: object) -> RunResult:
    return RunResult(precision="32-true", step_time_median_s=0.010, peak_memory_bytes=1000, eval_metric=0.90, **kw)  # type: ignore[arg-type]


def test_speedup_memory_and_tolerance_are_measured_against_the_reference() -> None:
    run = RunResult(precision="bf16-mixed", step_time_median_s=0.004, peak_memory_bytes=700, eval_metric=0.885)
    result = BenchResult(workload="w", runs=[_ref(), run])
    apply_verdicts(result, ACC)
    assert math.isclose(run.speedup_vs_fp32, 2.5) and math.isclose(run.memory_saved_vs_fp32, 0.3)
    assert run.within_tolerance is True
    assert run.verdict == "bf16-mixed: 2.50x faster, 30% less memory, accuracy 0.885 within 0.02 of 32-true (0.9): pays on this model and device"
    assert result.eval_tolerance == "accuracy within 0.02 of 32-true"
    assert result.runs[0].verdict == "32-true: the fp32 reference" and result.runs[0].speedup_vs_fp32 == 1.0


def test_faster_but_less_accurate_does_not_pay() -> None:
    run = RunResult(precision="bf16-true", step_time_median_s=0.005, peak_memory_bytes=500, eval_metric=0.80)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), run]), ACC)
    assert run.within_tolerance is False
    assert "OUTSIDE 0.02" in run.verdict and run.verdict.endswith("does not pay on this model and device")


def test_slower_and_same_memory_does_not_pay_and_small_differences_read_as_same_speed() -> None:
    slow = RunResult(precision="16-mixed", step_time_median_s=0.09, peak_memory_bytes=1000, eval_metric=0.9)
    same = RunResult(precision="tf32", step_time_median_s=0.0099, peak_memory_bytes=1000, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), slow, same]), ACC)
    assert slow.verdict.startswith("16-mixed: 9.00x slower, same memory") and slow.verdict.endswith("does not pay on this model and device")
    assert same.verdict.startswith("tf32: as fast (1.01x)")


def test_slower_but_leaner_trades_speed_for_memory_and_as_fast_but_leaner_pays() -> None:
    slow = RunResult(precision="16-mixed", step_time_median_s=0.3, peak_memory_bytes=800, eval_metric=0.9)
    level = RunResult(precision="bf16-true", step_time_median_s=0.0101, peak_memory_bytes=500, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), slow, level]), ACC)
    assert slow.verdict.startswith("16-mixed: 30.00x slower, 20% less memory")
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
