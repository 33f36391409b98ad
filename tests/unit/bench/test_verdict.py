"""Verdicts against the fp32 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ampkit.bench._results import BenchResult, RunResult
from ampkit.bench._verdict import (
    FEW_EVAL_SAMPLES,
    PAYS_SPEEDUP,
    SAME_SPEED,
    Tolerance,
    apply_verdicts,
    check_tolerance,
)
from ampkit.workloads._user import EvalLoss

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
    steady, noisy = _run("bf16-mixed", 0.010 / 1.06, eval_metric=0.9), _run("bf16-mixed", 0.010 / 1.06, spread=0.4, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), steady]), ACC)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(spread=0.4), noisy]), ACC)
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
    steady, noisy = _run("16-mixed", 0.012, peak_memory_bytes=500, eval_metric=0.9), _run("16-mixed", 0.012, spread=0.4, peak_memory_bytes=500, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(), steady]), ACC)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(spread=0.4), noisy]), ACC)
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


# -- Issue 35, item 5: verdicts against the noise of what they compare ---------------------------------------------
# The numbers are the ones the issue quotes: the H200 run of 2026-11-27 (gpt, large) and two user benches scored
# by their eval loss.

H200_PPL = {"32-true": 7.277, "bf16-true": 7.516, "bf16-true-masters": 6.927, "bf16-true-remainder": 6.927,
            "bf16-true-kahan": 7.072, "bf16-true-sr": 7.461, "16-true-masters": 7.063}
H200_MS = {"32-true": 52.9, "bf16-true": 12.2, "bf16-true-masters": 14.9, "bf16-true-remainder": 15.9,
           "bf16-true-kahan": 22.6, "bf16-true-sr": 60.7, "16-true-masters": 14.7}
H200_GIB = {"32-true": 2.97, "bf16-true": 1.50, "bf16-true-masters": 2.11, "bf16-true-remainder": 1.88,
            "bf16-true-kahan": 1.58, "bf16-true-sr": 1.50, "16-true-masters": 2.11}


def _h200(*policies: str) -> list[RunResult]:
    return [_run(p, H200_MS[p] / 1000, peak_memory_bytes=int(H200_GIB[p] * 2**30), eval_metric=H200_PPL[p]) for p in ("32-true", *policies)]


def _worse_by(value: float, reference: float) -> float:
    """How much worse a perplexity is than the reference's, as a fraction of it (negative: better)."""
    return (value - reference) / reference


def test_a_better_metric_is_never_a_failure_and_says_the_comparison_is_noisy() -> None:
    runs = _h200("bf16-true-masters")
    result = BenchResult(workload="gpt", runs=runs)
    apply_verdicts(result, PPL)
    masters = runs[1]
    assert _worse_by(6.927, 7.277) < -PPL.tolerance  # better by more than the tolerance: the old verdict said OUTSIDE
    assert masters.within_tolerance is True and masters.quality == "better"
    assert "OUTSIDE" not in masters.verdict and "does not pay" not in masters.verdict
    assert "4.8% better than 32-true (7.277)" in masters.verdict and "the comparison is noisy" in masters.verdict
    assert masters.verdict.endswith(": pays on this model and device")
    assert result.eval_noise is not None and "bf16-true-masters landed 4.8% better than 32-true" in result.eval_noise


def test_a_policy_worse_by_no_more_than_another_landed_better_is_inconclusive_not_a_loss() -> None:
    # bf16-true 3.3% worse while bf16-true-masters landed 4.8% better: the run's own spread covers the gap.
    runs = _h200("bf16-true", "bf16-true-masters")
    apply_verdicts(BenchResult(workload="gpt", runs=runs), PPL)
    plain = runs[1]
    assert PPL.tolerance < _worse_by(7.516, 7.277) < -_worse_by(6.927, 7.277)
    assert plain.quality == "unclear" and plain.within_tolerance is None
    assert "3.3% worse than 32-true (7.277)" in plain.verdict and "bf16-true-masters landed 4.8% better" in plain.verdict
    assert ": inconclusive on this model and device" in plain.verdict and "does not pay" not in plain.verdict
    # Alone, with nothing landing better, the same gap is a loss.
    alone = _h200("bf16-true")
    apply_verdicts(BenchResult(workload="gpt", runs=alone), PPL)
    assert alone[1].quality == "worse" and alone[1].within_tolerance is False
    assert "OUTSIDE 2% of 32-true (7.277; 3.3% worse" in alone[1].verdict and alone[1].verdict.endswith("does not pay on this model and device")


def test_the_16_bit_weights_summary_does_not_advise_fp32_weights_when_its_policies_beat_fp32() -> None:
    runs = _h200("bf16-true", "bf16-true-masters", "bf16-true-remainder", "bf16-true-kahan", "bf16-true-sr", "16-true-masters")
    result = BenchResult(workload="gpt", runs=runs)
    apply_verdicts(result, PPL)
    assert result.recovery is not None and "keep fp32 weights" not in result.recovery
    assert result.recovery.startswith("16-bit weights: bf16-true-masters, bf16-true-remainder, bf16-true-kahan, 16-true-masters keep "
                                      "32-true's perplexity (6.927, 6.927, 7.072, 7.063 vs 7.277)")
    assert "bf16-true, bf16-true-sr are worse by no more than this run's noise (7.516, 7.461 vs 7.277): unclear" in result.recovery
    assert "recover" not in result.recovery  # nothing was shown to be lost
    assert "the leanest that does: bf16-true-kahan (peak 1.58 GiB;" in result.recovery


# The eval loss of a user's classifier, near zero: 1.69x faster and 36% leaner (the first case).
EVAL_LOSS = Tolerance(EvalLoss.name, EvalLoss.higher_is_better, EvalLoss.tolerance, EvalLoss.relative)


def test_a_near_zero_eval_loss_is_judged_on_the_losss_own_scale_not_as_a_fraction_of_it() -> None:
    ref = _run("32-true", 0.0169, peak_memory_bytes=1000, eval_metric=0.01989)
    fast = _run("bf16-mixed", 0.0100, peak_memory_bytes=640, eval_metric=0.02209)
    apply_verdicts(BenchResult(workload="w", runs=[ref, fast]), EVAL_LOSS)
    assert (0.02209 - 0.01989) / 0.01989 > 0.1  # 11% "worse": the old relative tolerance called it a failure
    assert fast.within_tolerance is True and fast.quality == "as good"
    assert "eval loss 0.02209 within 0.02 of 32-true (0.01989)" in fast.verdict
    assert fast.verdict.endswith(": pays on this model and device")


def test_a_near_zero_eval_loss_does_not_advise_fp32_weights() -> None:
    # The second case: "keep fp32 weights" over 0.000522 against 0.000509.
    runs = [_run("32-true", 0.010, peak_memory_bytes=1000, eval_metric=0.000509),
            _run("bf16-true", 0.008, peak_memory_bytes=500, eval_metric=0.000522),
            _run("bf16-true-remainder", 0.008, peak_memory_bytes=600, eval_metric=0.000522)]
    result = BenchResult(workload="w", runs=runs)
    apply_verdicts(result, EVAL_LOSS)
    assert result.recovery is not None and "keep fp32 weights" not in result.recovery
    assert result.recovery.startswith("16-bit weights: bf16-true, bf16-true-remainder keep 32-true's eval loss (0.000522, 0.000522 vs 0.000509)")
    assert "recover" not in result.recovery and "the leanest that does: bf16-true (peak 500 B" in result.recovery


def test_nothing_lost_is_not_called_recovered() -> None:
    result = BenchResult(workload="w", runs=_weights_runs(**{"bf16-true": 0.9, "bf16-true-masters": 0.9}))
    apply_verdicts(result, ACC)
    assert result.recovery is not None and "recover" not in result.recovery
    assert result.recovery.startswith("16-bit weights: bf16-true, bf16-true-masters keep 32-true's accuracy (0.9, 0.9 vs 0.9)")


def test_as_fast_within_a_wide_interval_is_inconclusive_even_when_leaner() -> None:
    # "as fast (1.00x; 0.41–1.63x) ... pays": step times scattered ±80% around the same median.
    ref, run = _run("32-true", 0.010, spread=0.8, peak_memory_bytes=1000, eval_metric=0.9), _run("bf16-true", 0.010, spread=0.8, peak_memory_bytes=500, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[ref, run]), ACC)
    assert run.speedup_low < 1.0 - SAME_SPEED and 1.0 < run.speedup_high
    assert run.verdict.startswith("bf16-true: as fast (1.00x; ")
    assert ": inconclusive on this model and device (it saves memory, but" in run.verdict and "pays" not in run.verdict
    # The same median with an interval too wide to rule out a 5% gain is no "does not pay" either.
    same = _run("tf32", 0.010, spread=0.8, peak_memory_bytes=1000, eval_metric=0.9)
    apply_verdicts(BenchResult(workload="w", runs=[_ref(spread=0.8), same]), ACC)
    assert same.speedup_high > PAYS_SPEEDUP and ": inconclusive on this model and device" in same.verdict


def test_without_eval_data_the_verdict_says_quality_was_not_measured_and_never_pays() -> None:
    ref = _run("32-true", 0.010, peak_memory_bytes=1000)
    fast = _run("bf16-mixed", 0.005, peak_memory_bytes=600)
    slow = _run("16-mixed", 0.05, peak_memory_bytes=1000)
    result = BenchResult(workload="resnet", runs=[ref, fast, slow])
    apply_verdicts(result, None)
    assert fast.verdict.startswith("bf16-mixed: 2.00x faster (") and "40% less memory" in fast.verdict
    assert fast.verdict.endswith(": quality not measured (no eval metric), so not called pays") and fast.outcome == "quality not measured"
    assert slow.verdict.endswith(": does not pay on this model and device")  # no gain: the quality would not change that


def _noisy_reference(per_batch: list[float]) -> RunResult:
    return _run("32-true", 0.010, peak_memory_bytes=1000, eval_metric=float(np.mean(per_batch)), eval_batch_metrics=per_batch)


def _paired_band(*differences: list[float]) -> float:
    """Control: the 95% half-width of a mean per-batch difference, variances pooled over runs (scipy, apart from ampkit)."""
    from scipy import stats

    n = len(differences[0])
    pooled = float(np.mean([np.var(d, ddof=1) for d in differences]))
    return float(stats.t.ppf(0.975, len(differences) * (n - 1)) * np.sqrt(pooled / n))


def test_a_gap_within_the_eval_noise_is_not_a_loss_and_one_beyond_it_is() -> None:
    per_batch = [0.84, 0.92, 0.88, 0.96, 0.90]  # 32-true's accuracy on each of five eval batches: mean 0.90
    wobble = [0.04, -0.04, 0.03, -0.03, 0.0]  # how each run differs from 32-true batch by batch, about its mean gap
    band = _paired_band(wobble, wobble[::-1])
    assert band > ACC.tolerance  # the eval cannot resolve the 0.02 tolerance

    def shifted(gap: float, wobble: list[float]) -> list[float]:
        return [v - gap + w for v, w in zip(per_batch, wobble)]

    inside_batches, outside_batches = shifted(band - 0.005, wobble), shifted(band + 0.005, wobble[::-1])
    inside = _run("bf16-mixed", 0.005, peak_memory_bytes=600, eval_metric=float(np.mean(inside_batches)), eval_batch_metrics=inside_batches)
    outside = _run("bf16-true", 0.005, peak_memory_bytes=500, eval_metric=float(np.mean(outside_batches)), eval_batch_metrics=outside_batches)
    result = BenchResult(workload="w", runs=[_noisy_reference(per_batch), inside, outside])
    apply_verdicts(result, ACC)
    assert inside.quality == "as good" and inside.within_tolerance is True
    assert f"more than 0.02 but within the eval noise (±{band:.3g})" in inside.verdict and inside.verdict.endswith("pays on this model and device")
    assert outside.quality == "worse" and outside.verdict.endswith("does not pay on this model and device")
    assert f"beyond the eval noise ±{band:.3g}" in outside.verdict
    assert result.eval_noise is not None and result.eval_noise.startswith(f"Eval noise: ±{band:.3g} (")
    assert "over 5 eval batches" in result.eval_noise and "pooled over 2 runs" in result.eval_noise


def test_the_eval_noise_is_paired_so_how_hard_each_batch_is_cancels() -> None:
    # On gpt the reference's own spread over its 32 batches of different text made a band of 14% of perplexity
    # around a 2% tolerance: any loss passed. Each run is scored on the same batches, so the difficulty cancels.
    per_batch = [0.60, 0.95, 0.75, 0.99, 0.70]  # batches of very different difficulty
    worse = [v - 0.05 + w for v, w in zip(per_batch, [0.002, -0.002, 0.001, -0.001, 0.0])]  # 0.05 worse on every one
    run = _run("bf16-true", 0.005, peak_memory_bytes=500, eval_metric=float(np.mean(worse)), eval_batch_metrics=worse)
    result = BenchResult(workload="w", runs=[_noisy_reference(per_batch), run])
    apply_verdicts(result, ACC)
    assert run.quality == "worse" and run.outcome == "does not pay"
    from scipy import stats

    unpaired = stats.t.ppf(0.975, 4) * stats.sem(per_batch)
    assert unpaired > 0.05  # the unpaired band would have called this loss noise


def test_with_one_eval_batch_the_noise_is_said_to_be_unmeasured() -> None:
    result = BenchResult(workload="w", runs=[_noisy_reference([0.9]), _run("bf16-mixed", 0.005, eval_metric=0.89)])
    apply_verdicts(result, ACC)
    assert result.eval_noise is not None and "not measured" in result.eval_noise and "1 eval batch" in result.eval_noise


def test_every_verdict_word_printed_has_one_definition() -> None:
    runs = _h200("bf16-true", "bf16-true-masters", "bf16-true-sr")
    result = BenchResult(workload="gpt", runs=runs)
    apply_verdicts(result, PPL)
    from ampkit.bench._verdict import VERDICTS

    assert {r.outcome for r in runs[1:]} == {"pays", "inconclusive"}
    assert set(VERDICTS) == {"pays", "trades speed for memory", "inconclusive", "does not pay", "quality not measured"}
    for run in runs[1:]:
        assert run.outcome in VERDICTS and f": {run.outcome}" in run.verdict


def test_when_every_16_bit_run_is_unclear_the_summary_says_so_and_gives_no_advice() -> None:
    runs = _h200("bf16-true", "bf16-true-sr")
    runs.append(_run("bf16-mixed", 0.0146, peak_memory_bytes=2 * 2**30, eval_metric=6.927))  # fp32 weights, 4.8% better
    result = BenchResult(workload="gpt", runs=runs)
    apply_verdicts(result, PPL)
    assert result.recovery == ("16-bit weights: bf16-true, bf16-true-sr are worse by no more than this run's noise (7.516, 7.461 vs 7.277): "
                               "unclear; none is shown to keep 32-true's perplexity: rerun with more --steps or another --seed")
