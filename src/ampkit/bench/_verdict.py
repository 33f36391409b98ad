"""Compare every run with the fp32 reference: speed-up, memory saved, eval metric against tolerance and noise, a verdict.

The rule, in the order it is applied (each verdict word is defined once, in :data:`VERDICTS`, and printed with
its definition under the verdicts):

1. The loss diverged, or the eval metric is **worse** than the reference's beyond the tolerance, the reference's
   eval noise and the run's spread (:mod:`ampkit.bench._quality`: one-sided, better is never a failure):
   **does not pay**, whatever the speed.
2. At least :data:`PAYS_SPEEDUP` faster by the medians with the speed-up's 95% interval
   (:func:`ampkit.bench.speedup_interval`, a bootstrap of the two samples of step times) wholly above 1.0:
   **pays**.
3. At least :data:`PAYS_MEMORY` leaner: **pays** when the interval rules out a slow-down of more than
   :data:`SAME_SPEED` (its low end at least ``1 - SAME_SPEED``); **trades speed for memory** when it lies wholly
   below 1.0; else **inconclusive** (the memory saving is exact, the speed is not known).
4. Any other interval that holds 1.0, or reaches :data:`PAYS_SPEEDUP`, or too few timed steps to compute it:
   **inconclusive**: the difference is within the step-time noise, so rerun with more ``--steps``. Else
   **does not pay** (no gain was measured).
5. What pays or trades by 2-4 is **inconclusive** when the eval metric is worse by no more than the run's spread
   (quality ``unclear``), and **quality not measured** without an eval metric: a gain in speed or memory is never
   called "pays" unless the eval metric shows the policy trains as well.

The runs that store the weights in 16 bits (``bf16-true`` and its remedies for lost updates: masters, remainder
masters, Kahan summation, stochastic rounding) also get one verdict together, ``result.recovery``: which of them
lose the reference's eval metric, which keep (or recover) it, and the leanest that does (:func:`recovery_verdict`).

A compiled twin (``--compile``) is judged by the same rule against the reference; its verdict adds its speed-up
over its eager twin (same policy) and its compile time, which no step time includes.

An eval metric computed on fewer than :data:`FEW_EVAL_SAMPLES` samples says so in the verdict: a difference of
a point or two between policies is then chance as much as precision.

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> ref = RunResult(precision="32-true", step_time_median_s=0.02, peak_memory_bytes=1000, eval_metric=0.95,
    ...                 step_times_s=[0.0198, 0.0199, 0.02, 0.0201, 0.0202])
    >>> fast = RunResult(precision="bf16-mixed", step_time_median_s=0.01, peak_memory_bytes=600, eval_metric=0.94,
    ...                  step_times_s=[0.0099, 0.00995, 0.01, 0.01005, 0.0101])
    >>> result = BenchResult(workload="digits", runs=[ref, fast], eval_samples=360)
    >>> apply_verdicts(result, Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False))
    >>> fast.verdict
    'bf16-mixed: 2.00x faster (1.97–2.03x), 40% less memory, accuracy 0.94 within 0.02 of 32-true (0.95): pays on this model and device'
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .._errors import PolicyError
from ..policy import Policy, get_policy
from ._format import fmt_bytes, fmt_float
from ._quality import (
    EvalNoise,
    Judged,
    Judgement,
    Tolerance,
    check_tolerance,
    judge,
    metric_words,
    paired_eval_noise,
    t_975,
)
from ._results import BenchResult, RunResult
from ._speedup import MIN_TIMED_STEPS, speedup_interval

__all__ = [
    "FEW_EVAL_SAMPLES",
    "PAYS_MEMORY",
    "PAYS_SPEEDUP",
    "SAME_SPEED",
    "VERDICTS",
    "Tolerance",
    "apply_verdicts",
    "check_tolerance",
    "recovery_verdict",
]

SAME_SPEED = 0.03
"""Speed differences under 3% are called "as fast": interleaved medians on a busy 2-core CPU vary by about 2%."""
PAYS_SPEEDUP = 1.05
"""A policy pays when its eval metric is as good and it is at least 5% faster than fp32 (and the speed-up's
interval clears 1.0) ..."""
PAYS_MEMORY = 0.10
"""... or when it saves at least 10% of fp32's memory and is surely not slower by more than :data:`SAME_SPEED`.
Surely slower but leaner "trades speed for memory"."""
FEW_EVAL_SAMPLES = 100
"""An eval metric from fewer samples than this is flagged: on 100 samples one sample is a whole point of
accuracy, and the binomial noise of an accuracy near 0.9 is about 3 points, more than the usual tolerance."""

_AS_GOOD = "its eval metric is not worse than 32-true's by more than the tolerance or the eval noise (better never counts against it)"
VERDICTS: dict[str, str] = {
    "pays": f"{_AS_GOOD}, and it is at least {PAYS_SPEEDUP - 1:.0%} faster with the speed-up's whole 95% interval "
    f"above 1.0, or it saves at least {PAYS_MEMORY:.0%} of the memory with the interval ruling out a slow-down of "
    f"more than {SAME_SPEED:.0%}",
    "trades speed for memory": f"{_AS_GOOD}, and it saves at least {PAYS_MEMORY:.0%} of the memory but is surely "
    "slower (the speed-up's whole 95% interval below 1.0): worth it where memory is what limits",
    "inconclusive": "the noise hides the answer: the speed-up's 95% interval (or too few timed steps) cannot tell a "
    "gain that would pay from none or from a slow-down, or its eval metric is worse by no more than another policy "
    "landed better (unclear): rerun with more --steps",
    "does not pay": "the loss diverged, or its eval metric is worse than 32-true's beyond the tolerance, the eval "
    "noise and the run's spread, or no gain in speed or memory was measured",
    "quality not measured": "a gain in speed or memory, but no eval metric to show it trains as well as 32-true: "
    "never called pays",
}
"""Every word a verdict ends with, and what it means (printed under the verdicts, for the words used)."""


def _speed_words(speedup: float, low: float | None, high: float | None) -> str:
    if low is None or high is None:
        span = ""  # the outcome says why there is no interval
    elif speedup < 1.0 - SAME_SPEED:  # a slower run's interval in "slower" factors, the way its median is stated
        span = f"{1 / high:.2f}–{1 / low:.2f}x slower"
    else:
        span = f"{low:.2f}–{high:.2f}x"
    if abs(speedup - 1.0) < SAME_SPEED:
        return f"as fast ({speedup:.2f}x; {span})" if span else f"as fast ({speedup:.2f}x)"
    words = f"{speedup:.2f}x faster" if speedup > 1 else f"{1 / speedup:.2f}x slower"
    return f"{words} ({span})" if span else words


def _memory_words(saved: float) -> str:
    if abs(saved) < 0.005:
        return "same memory"
    return f"{saved:.0%} less memory" if saved > 0 else f"{-saved:.0%} more memory"


def _than(speed: str, other: str) -> str:
    """``speed`` words (from :func:`_speed_words`) against ``other``: "1.2x faster than X", "as fast as X (1.01x)".

    >>> _than("as fast (1.01x)", "bf16-mixed eager"), _than("1.20x faster (1.1–1.3x)", "bf16-mixed eager")
    ('as fast as bf16-mixed eager (1.01x)', '1.20x faster than bf16-mixed eager (1.1–1.3x)')
    """
    words, _, span = speed.partition(" (")
    tail = f" ({span}" if span else ""
    return f"as fast as {other}{tail}" if words == "as fast" else f"{words} than {other}{tail}"


def _compiled_words(run: RunResult, twin: RunResult | None, ref_name: str) -> list[str]:
    """A compiled run against its eager twin: the speed-up (with its interval) and the compile time apart."""
    if twin is None or not twin.ok or not run.step_time_median_s or not twin.step_time_median_s:
        return []
    run.speedup_vs_eager = twin.step_time_median_s / run.step_time_median_s
    interval = speedup_interval(twin.step_times_s, run.step_times_s) or (None, None)
    # The reference's twin: the speed-up over 32-true already is the one over eager.
    words = [] if twin.precision == ref_name else [_than(_speed_words(run.speedup_vs_eager, *interval), f"{twin.label} eager")]
    if run.compile_time_s is not None:
        words.append(f"compiling took {run.compile_time_s:.1f} s (not in the step time)")
    return words


def _compare(run: RunResult, ref: RunResult) -> None:
    if run.step_time_median_s and ref.step_time_median_s:
        run.speedup_vs_fp32 = ref.step_time_median_s / run.step_time_median_s
        interval = speedup_interval(ref.step_times_s, run.step_times_s)
        run.speedup_low, run.speedup_high = interval if interval is not None else (None, None)
    if run.peak_memory_bytes is not None and ref.peak_memory_bytes:
        run.memory_saved_vs_fp32 = 1.0 - run.peak_memory_bytes / ref.peak_memory_bytes


def _gain(run: RunResult) -> tuple[str, str]:
    """Rules 2-4 of the module docstring, by speed and memory alone: the outcome, and why when inconclusive."""
    speedup, low, high = run.speedup_vs_fp32, run.speedup_low, run.speedup_high
    if speedup is not None and speedup >= PAYS_SPEEDUP and low is not None and low > 1.0:
        return "pays", ""
    if (run.memory_saved_vs_fp32 or 0.0) >= PAYS_MEMORY:
        if low is not None and low >= 1.0 - SAME_SPEED:
            return "pays", ""  # the saving is exact, and the interval rules out a slow-down worth the name
        if high is not None and high < 1.0:
            return "trades speed for memory", ""  # slower, but it may be what lets a model fit at all
        slower = speedup is not None and speedup < 1.0 - SAME_SPEED
        return "inconclusive", "it saves memory, but " + _noise(run, "slow-down" if slower else "difference in speed")
    if speedup is not None and (high is None or high >= PAYS_SPEEDUP):  # a gain worth having is not ruled out
        return "inconclusive", _noise(run, "speed-up" if speedup >= PAYS_SPEEDUP else "difference in speed")
    return "does not pay", ""


def _noise(run: RunResult, what: str) -> str:
    if run.speedup_low is None:
        return f"too few timed steps (under {MIN_TIMED_STEPS}) to tell the {what} from noise; rerun with more --steps"
    return f"the {what} is within the step-time noise; rerun with more --steps"


class _Comparison:
    """The eval metrics of a bench's runs against the reference's: the tolerance, the noise, each run's judgement."""

    def __init__(self, result: BenchResult, ref: RunResult, tolerance: Tolerance | None) -> None:
        self.ref, self.tolerance = ref, tolerance
        self.runs = [r for r in result.runs if r is not ref]
        # Paired: every run is scored on the reference's eval batches, so a batch's difficulty cancels (quality.py).
        self.noise: EvalNoise | None = paired_eval_noise(ref.eval_batch_metrics, [r.eval_batch_metrics for r in self.runs if r.ok])
        values = [r.eval_metric if r.ok else None for r in self.runs]
        if tolerance is None or ref.eval_metric is None:
            self.judged = Judged([Judgement(None, None) for _ in self.runs], 0.0, None)
        else:
            self.judged = judge(values, ref.eval_metric, tolerance, self.noise)

    def of(self, run: RunResult) -> Judgement:
        # By identity: RunResult compares by value, and two runs may hold the same figures.
        return self.judged.runs[next(i for i, r in enumerate(self.runs) if r is run)]

    @property
    def best(self) -> RunResult | None:
        """The run that landed furthest better than the reference beyond both margins (it sets the spread)."""
        return None if self.judged.best is None else self.runs[self.judged.best]

    def band(self) -> str:
        assert self.tolerance is not None and self.ref.eval_metric is not None
        return "not measured" if self.noise is None else f"±{self.tolerance.size(self.noise.band, self.ref.eval_metric)}"

    def beyond(self) -> str:
        """What a gap called better or unclear exceeds: the tolerance, and the eval noise where it was measured."""
        assert self.tolerance is not None
        amount = self.tolerance.amount()
        return f"beyond {amount} (eval noise not measured)" if self.noise is None else f"beyond {amount} and the eval noise ({self.band()})"

    def words(self, run: RunResult) -> str | None:
        """The eval part of ``run``'s verdict, or None when its quality was not measured."""
        j, tol, ref = self.of(run), self.tolerance, self.ref
        if j.word is None or j.worse_by is None or tol is None or ref.eval_metric is None or run.eval_metric is None:
            return None
        name, value, reference = metric_words(tol.name), fmt_float(run.eval_metric), fmt_float(ref.eval_metric)
        head = f"{name} {value}"
        if not math.isfinite(j.worse_by):
            return f"{head} OUTSIDE {tol.amount()} of {ref.label} ({reference})"
        size, against = tol.size(j.worse_by, ref.eval_metric), f"{ref.label} ({reference})"
        side = "worse" if j.worse_by > 0 else "better"
        if j.word == "as good" and abs(j.worse_by) <= tol.allowed(ref.eval_metric) + 1e-12:
            return f"{head} within {tol.amount()} of {against}"
        if j.word == "as good":
            limit = f"more than {tol.amount()} but within" if side == "worse" else "within"
            return f"{head}, {size} {side} than {against}: {limit} the eval noise ({self.band()})"
        if j.word == "better":
            return f"{head}, {size} better than {against}: {self.beyond()}, so the comparison is noisy"
        if j.word == "unclear":
            best = self.best
            assert best is not None and best.eval_metric is not None
            spread = tol.size(self.judged.spread, ref.eval_metric)
            return f"{head}, {size} worse than {against}: {self.beyond()}, but {best.label} landed {spread} better"
        noise = "eval noise not measured" if self.noise is None else f"beyond the eval noise {self.band()}"
        return f"{head} OUTSIDE {tol.amount()} of {ref.label} ({reference}; {size} worse, {noise})"

    def noise_line(self) -> str | None:
        """The reference's eval noise in words, and whether the comparison is noisy (``result.eval_noise``)."""
        tol, ref = self.tolerance, self.ref
        if tol is None or ref.eval_metric is None:
            return None
        name = metric_words(tol.name)
        if self.noise is not None:
            noise = self.noise
            t = t_975(noise.dof if noise.dof is not None else noise.batches - 1)
            runs = f"{noise.runs} run{'' if noise.runs == 1 else 's'}"
            line = (f"Eval noise: {self.band()} ({t:.3g} standard errors of the per-batch differences from {ref.label}'s "
                    f"{name} over {noise.batches} eval batches, each scored alone, pooled over {runs}): a gap within it "
                    "is one this eval set cannot resolve.")
        else:
            n = len(ref.eval_batch_metrics)
            why = f"{n} eval batch{'' if n == 1 else 'es'} scored alone" if n else "no eval batch scored alone"
            line = f"Eval noise: not measured ({why}; it takes 2 or more), so gaps are held to the tolerance alone."
        best = self.best
        if best is not None:
            spread = tol.size(self.judged.spread, ref.eval_metric)
            line += (f" Noisy comparison: {best.label} landed {spread} better than {ref.label}, beyond the tolerance and "
                     f"the eval noise; a change of precision does not make a model better, so gaps up to {spread} either "
                     "way are this run's noise: rerun with more --steps or another --seed.")
        return line


def _verdict(run: RunResult, comparison: _Comparison, eval_samples: int | None, twin: RunResult | None = None) -> tuple[str, str | None]:
    """``run``'s verdict line and its word (None for a run without figures)."""
    if not run.ok:
        return f"{run.label}: {run.status}: {run.error or 'no figures'}", None
    ref = comparison.ref
    parts = []
    if run.speedup_vs_fp32 is not None:
        parts.append(_speed_words(run.speedup_vs_fp32, run.speedup_low, run.speedup_high))
    parts += _compiled_words(run, twin, ref.precision)
    if run.memory_saved_vs_fp32 is not None:
        parts.append(_memory_words(run.memory_saved_vs_fp32))
    quality = comparison.words(run)
    if quality is not None:
        few = eval_samples is not None and eval_samples < FEW_EVAL_SAMPLES
        parts.append(quality + (f" on only {eval_samples} eval samples" if few else ""))
    said = f"{run.label}: {', '.join(parts)}"
    if run.status == "diverged":
        return f"{said}: the loss diverged: does not pay", "does not pay"
    word = comparison.of(run).word
    outcome, why = ("does not pay", "") if word == "worse" else _gain(run)
    if word == "unclear" and outcome != "does not pay":
        outcome, why = "inconclusive", "; ".join(filter(None, [why, "the eval gap is within this run's spread; rerun with more --steps or another --seed"]))
    elif word is None and outcome in ("pays", "trades speed for memory"):
        return f"{said}: quality not measured ({_unmeasured(run, comparison)}), so not called pays", "quality not measured"
    elif word is None and outcome == "inconclusive":
        why += f"; quality not measured ({_unmeasured(run, comparison)})"
    return f"{said}: {outcome} on this model and device" + (f" ({why})" if why else ""), outcome


def _unmeasured(run: RunResult, comparison: _Comparison) -> str:
    ref = comparison.ref
    if comparison.tolerance is None or ref.eval_metric is None:
        return "no eval metric"
    if not math.isfinite(ref.eval_metric):
        return f"{ref.label}'s eval metric is not finite"
    return "no eval metric for this run"


def apply_verdicts(result: BenchResult, tolerance: Tolerance | None, policies: Mapping[str, Policy] | None = None) -> None:
    """Fill speed-up (and its interval), memory saved, quality, within-tolerance, verdict and outcome of every run
    against ``result.reference``, by the rule of this module's docstring; and the result's eval noise and recovery.

    ``policies``: the Policy each run trained under, by its name (the runner's); a run not in it (a result read back
    from results.json) is looked up by name in the registry."""
    ref = result.run(result.reference)
    if tolerance is not None:
        result.eval_tolerance = tolerance.describe(result.reference)
        if result.eval_samples is not None and result.eval_samples < FEW_EVAL_SAMPLES:
            result.eval_tolerance += f" (on only {result.eval_samples} eval samples: differences this small may be chance)"
    if ref is None or not ref.ok:
        for run in result.runs:
            run.verdict = f"{run.label}: no {result.reference} reference to compare with" if run.ok else f"{run.label}: {run.status}: {run.error or 'no figures'}"
        result.recovery = None
        return
    for run in result.runs:
        _compare(run, ref)
    comparison = _Comparison(result, ref, tolerance)
    result.eval_noise = comparison.noise_line()
    ref.verdict = f"{ref.label}: the fp32 reference"
    if tolerance is not None and ref.eval_metric is not None and math.isfinite(ref.eval_metric):
        ref.quality, ref.within_tolerance = "as good", True  # itself: a gap of 0
    for run in comparison.runs:
        judgement = comparison.of(run)
        run.quality = judgement.word
        run.within_tolerance = {"as good": True, "better": True, "worse": False}.get(judgement.word or "")
        twin = result.run(run.precision) if run.compile is not None else None
        run.verdict, run.outcome = _verdict(run, comparison, result.eval_samples, twin)
    result.recovery = _recovery(comparison, policies or {})


def recovery_verdict(result: BenchResult, tolerance: Tolerance | None) -> str | None:
    """Which runs with 16-bit weights lose the reference's eval metric, which keep it (or recover it, when some
    lose it), and the leanest of those by peak memory; judged as :mod:`ampkit.bench._quality` judges every run.

    None unless there is a tolerance, a reference metric and at least two eager 16-bit-weight runs with a metric
    (one alone is judged by its own verdict).

    >>> from ampkit.bench._results import BenchResult, RunResult
    >>> runs = [RunResult(precision="32-true", eval_metric=0.95, peak_memory_bytes=100 << 20),
    ...         RunResult(precision="bf16-true", eval_metric=0.90, peak_memory_bytes=50 << 20),
    ...         RunResult(precision="bf16-true-masters", eval_metric=0.95, peak_memory_bytes=80 << 20),
    ...         RunResult(precision="bf16-true-remainder", eval_metric=0.95, peak_memory_bytes=70 << 20)]
    >>> print(recovery_verdict(BenchResult(workload="w", runs=runs), Tolerance("accuracy", True, 0.02, False)))
    16-bit weights: bf16-true loses 32-true's accuracy (0.9 vs 0.95); bf16-true-masters, bf16-true-remainder recover it; the leanest that does: bf16-true-remainder (peak 70.0 MiB; bf16-true-masters 80.0 MiB)
    """
    ref = result.run(result.reference)
    if ref is None or not ref.ok:
        return None
    return _recovery(_Comparison(result, ref, tolerance), {})


def _recovery(comparison: _Comparison, policies: Mapping[str, Policy]) -> str | None:
    ref, tolerance = comparison.ref, comparison.tolerance
    if tolerance is None or ref.eval_metric is None:
        return None
    runs = [r for r in comparison.runs if r.ok and r.compile is None and r.eval_metric is not None and _stores_16_bit(r.precision, policies)]
    if len(runs) < 2:
        return None
    words = [comparison.of(run).word for run in runs]
    lose, unclear = ([r for r, w in zip(runs, words) if w == word] for word in ("worse", "unclear"))
    keep = [r for r, w in zip(runs, words) if w in ("as good", "better")]
    what, reference = f"{ref.label}'s {metric_words(tolerance.name)}", fmt_float(ref.eval_metric)

    def figures(group: list[RunResult]) -> str:
        return f"({', '.join(fmt_float(r.eval_metric) for r in group)} vs {reference})"

    def names(group: list[RunResult], one: str, many: str) -> str:
        return f"{', '.join(r.label for r in group)} {one if len(group) == 1 else many}"

    parts = []
    if lose:
        parts.append(f"{names(lose, 'loses', 'lose')} {what} {figures(lose)}")
    if keep:
        parts.append(names(keep, "recovers it", "recover it") if lose else f"{names(keep, 'keeps', 'keep')} {what} {figures(keep)}")
        measured = [r for r in keep if r.peak_memory_bytes is not None]
        if measured:
            lean = min(measured, key=lambda r: r.peak_memory_bytes or 0)
            others = "; ".join(f"{r.label} {fmt_bytes(r.peak_memory_bytes)}" for r in measured if r is not lean)
            parts.append(f"the leanest that does: {lean.label} (peak {fmt_bytes(lean.peak_memory_bytes)}" + (f"; {others})" if others else ")"))
    if unclear:
        parts.append(f"{names(unclear, 'is', 'are')} worse by no more than this run's noise {figures(unclear)}: unclear")
    if not keep:
        parts.append(f"none is shown to keep {what}: rerun with more --steps or another --seed" if unclear else "none recovers it: keep fp32 weights (a mixed policy)")
    return "16-bit weights: " + "; ".join(parts)


def _stores_16_bit(precision: str, policies: Mapping[str, Policy]) -> bool:
    try:
        return (policies.get(precision) or get_policy(precision)).param_dtype != torch.float32
    except PolicyError:  # a run of a policy this ampkit does not know (an old results.json)
        return False
