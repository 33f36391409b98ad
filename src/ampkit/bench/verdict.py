"""Compare every run with the fp32 reference: speed-up, memory saved, eval metric within tolerance, a verdict.

The rule, in the order it is applied:

1. An eval metric OUTSIDE the tolerance: **does not pay**, whatever the speed.
2. At least :data:`PAYS_SPEEDUP` faster by the medians: **pays** when the speed-up's 95% interval
   (:func:`ampkit.bench.speedup.speedup_interval`, a bootstrap of the two samples of step times) lies wholly
   above 1.0; **inconclusive** when it holds 1.0 (or there were too few timed steps to compute it): the
   difference is within the step-time noise, so rerun with more ``--steps``.
3. At least :data:`PAYS_MEMORY` leaner and as fast by the medians: **pays** (the memory saving is exact).
4. Leaner but slower: **trades speed for memory** when the interval lies wholly below 1.0, else
   **inconclusive**.
5. Otherwise: **does not pay** (no gain was measured).

The runs that store the weights in 16 bits (``bf16-true`` and its remedies for lost updates: masters, remainder
masters, Kahan summation, stochastic rounding) also get one verdict together, ``result.recovery``: which of them
land within the tolerance of the reference's eval metric, and the leanest that does (:func:`recovery_verdict`).

A compiled twin (``--compile``) is judged by the same rule against the reference; its verdict adds its speed-up
over its eager twin (same policy) and its compile time, which no step time includes.

An eval metric computed on fewer than :data:`FEW_EVAL_SAMPLES` samples says so in the verdict: a difference of
a point or two between policies is then chance as much as precision.

    >>> from ampkit.bench.results import BenchResult, RunResult
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

import dataclasses
import math
from dataclasses import dataclass

import torch

from .._util.values import check_tolerance
from ..errors import PolicyError
from ..policy import get_policy
from .format import fmt_bytes
from .results import BenchResult, RunResult
from .speedup import MIN_TIMED_STEPS, speedup_interval

__all__ = [
    "FEW_EVAL_SAMPLES",
    "PAYS_MEMORY",
    "PAYS_SPEEDUP",
    "SAME_SPEED",
    "Tolerance",
    "apply_verdicts",
    "check_tolerance",
    "recovery_verdict",
]

SAME_SPEED = 0.03
"""Speed differences under 3% are called "as fast": interleaved medians on a busy 2-core CPU vary by about 2%."""
PAYS_SPEEDUP = 1.05
"""A policy pays when its eval metric is within tolerance and it is at least 5% faster than fp32 (and the
speed-up's interval clears 1.0) ..."""
PAYS_MEMORY = 0.10
"""... or as fast while saving at least 10% of fp32's memory. Slower but leaner "trades speed for memory"."""
FEW_EVAL_SAMPLES = 100
"""An eval metric from fewer samples than this is flagged: on 100 samples one sample is a whole point of
accuracy, and the binomial noise of an accuracy near 0.9 is about 3 points, more than the usual tolerance."""


@dataclass(frozen=True)
class Tolerance:
    """How far from the reference's eval metric a run may land and still count as equal."""

    name: str
    higher_is_better: bool
    tolerance: float
    """Absolute, or a fraction of the reference's figure when ``relative``."""
    relative: bool

    def __post_init__(self) -> None:
        check_tolerance(self.tolerance, f"Tolerance({self.name!r}).tolerance")

    def with_amount(self, amount: float) -> Tolerance:
        """The same metric with ``amount`` as its tolerance, in the metric's own terms (absolute or relative).

        >>> Tolerance("accuracy", True, 0.02, relative=False).with_amount(0.005).describe("32-true")
        'accuracy within 0.005 of 32-true'
        """
        return dataclasses.replace(self, tolerance=check_tolerance(amount))

    def within(self, value: float | None, reference: float | None) -> bool | None:
        """Whether ``value`` is within tolerance of ``reference``; None when either is missing or not finite."""
        if value is None or reference is None or not (math.isfinite(value) and math.isfinite(reference)):
            return None if value is None or reference is None else False
        allowed = self.tolerance * abs(reference) if self.relative else self.tolerance
        return abs(value - reference) <= allowed + 1e-12

    def describe(self, reference: str) -> str:
        """The tolerance in words, e.g. ``within 0.02 of 32-true``."""
        amount = f"{self.tolerance:.0%}" if self.relative else f"{self.tolerance:g}"
        return f"{self.name} within {amount} of {reference}"


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


def _compare(run: RunResult, ref: RunResult, tol: Tolerance | None) -> None:
    if run.step_time_median_s and ref.step_time_median_s:
        run.speedup_vs_fp32 = ref.step_time_median_s / run.step_time_median_s
        interval = speedup_interval(ref.step_times_s, run.step_times_s)
        run.speedup_low, run.speedup_high = interval if interval is not None else (None, None)
    if run.peak_memory_bytes is not None and ref.peak_memory_bytes:
        run.memory_saved_vs_fp32 = 1.0 - run.peak_memory_bytes / ref.peak_memory_bytes
    if tol is not None:
        run.within_tolerance = tol.within(run.eval_metric, ref.eval_metric)


def _outcome(run: RunResult) -> tuple[str, str]:
    """The rule of the module docstring, for a run that trained and whose eval (if any) is not outside: the
    outcome, and why when it is inconclusive."""
    speedup = run.speedup_vs_fp32 if run.speedup_vs_fp32 is not None else 1.0
    leaner = (run.memory_saved_vs_fp32 or 0.0) >= PAYS_MEMORY
    surely_faster = run.speedup_low is not None and run.speedup_low > 1.0
    surely_slower = run.speedup_high is not None and run.speedup_high < 1.0
    if run.speedup_vs_fp32 is not None and speedup >= PAYS_SPEEDUP:
        return ("pays", "") if surely_faster else ("inconclusive", _noise(run, "speed-up"))
    if leaner and speedup > 1.0 - SAME_SPEED:
        return "pays", ""
    if leaner:  # slower, but it may be what lets a model fit at all
        return ("trades speed for memory", "") if surely_slower else ("inconclusive", "it saves memory, but " + _noise(run, "slow-down"))
    return "does not pay", ""


def _noise(run: RunResult, what: str) -> str:
    if run.speedup_low is None:
        return f"too few timed steps (under {MIN_TIMED_STEPS}) to tell the {what} from noise; rerun with more --steps"
    return f"the {what} is within the step-time noise; rerun with more --steps"


def _verdict(run: RunResult, ref: RunResult, tol: Tolerance | None, eval_samples: int | None, twin: RunResult | None = None) -> str:
    if not run.ok:
        return f"{run.label}: {run.status}: {run.error or 'no figures'}"
    parts = []
    if run.speedup_vs_fp32 is not None:
        parts.append(_speed_words(run.speedup_vs_fp32, run.speedup_low, run.speedup_high))
    parts += _compiled_words(run, twin, ref.precision)
    if run.memory_saved_vs_fp32 is not None:
        parts.append(_memory_words(run.memory_saved_vs_fp32))
    if tol is not None and run.eval_metric is not None and ref.eval_metric is not None:
        amount = f"{tol.tolerance:.0%}" if tol.relative else f"{tol.tolerance:g}"
        where = "within" if run.within_tolerance else "OUTSIDE"
        few = f" on only {eval_samples} eval samples" if eval_samples is not None and eval_samples < FEW_EVAL_SAMPLES else ""
        parts.append(f"{tol.name} {run.eval_metric:.4g} {where} {amount} of {ref.precision} ({ref.eval_metric:.4g}){few}")
    if run.status == "diverged":
        return f"{run.label}: {', '.join(parts)}: the loss diverged: does not pay"
    outcome, why = ("does not pay", "") if run.within_tolerance is False else _outcome(run)
    return f"{run.label}: {', '.join(parts)}: {outcome} on this model and device" + (f" ({why})" if why else "")


def apply_verdicts(result: BenchResult, tolerance: Tolerance | None) -> None:
    """Fill speed-up (and its interval), memory saved, within-tolerance and verdict of every run against
    ``result.reference``, by the rule of this module's docstring."""
    ref = result.run(result.reference)
    if tolerance is not None:
        result.eval_tolerance = tolerance.describe(result.reference)
        if result.eval_samples is not None and result.eval_samples < FEW_EVAL_SAMPLES:
            result.eval_tolerance += f" (on only {result.eval_samples} eval samples: differences this small may be chance)"
    for run in result.runs:
        if ref is None or not ref.ok:
            run.verdict = f"{run.label}: no {result.reference} reference to compare with" if run.ok else _verdict(run, run, None, None)
            continue
        _compare(run, ref, tolerance)
        twin = result.run(run.precision) if run.compile is not None else None
        run.verdict = f"{run.label}: the fp32 reference" if run is ref else _verdict(run, ref, tolerance, result.eval_samples, twin)
    result.recovery = recovery_verdict(result, tolerance)


def recovery_verdict(result: BenchResult, tolerance: Tolerance | None) -> str | None:
    """Which runs with 16-bit weights recover the reference's eval metric, and the leanest of them by peak memory.

    None unless there is a tolerance, a reference metric and at least two eager 16-bit-weight runs with a metric
    (one alone is judged by its own verdict).

    >>> from ampkit.bench.results import BenchResult, RunResult
    >>> runs = [RunResult(precision="32-true", eval_metric=0.95, peak_memory_bytes=100 << 20),
    ...         RunResult(precision="bf16-true", eval_metric=0.90, peak_memory_bytes=50 << 20),
    ...         RunResult(precision="bf16-true-masters", eval_metric=0.95, peak_memory_bytes=80 << 20),
    ...         RunResult(precision="bf16-true-remainder", eval_metric=0.95, peak_memory_bytes=70 << 20)]
    >>> print(recovery_verdict(BenchResult(workload="w", runs=runs), Tolerance("accuracy", True, 0.02, False)))
    16-bit weights: bf16-true loses 32-true's accuracy (0.9 vs 0.95); bf16-true-masters, bf16-true-remainder recover it; the leanest that does: bf16-true-remainder (peak 70.0 MiB; bf16-true-masters 80.0 MiB)
    """
    ref = result.run(result.reference)
    if tolerance is None or ref is None or ref.eval_metric is None:
        return None
    runs = [r for r in result.runs if r.ok and r.compile is None and r.eval_metric is not None and _stores_16_bit(r.precision)]
    if len(runs) < 2:
        return None
    recover = [r for r in runs if tolerance.within(r.eval_metric, ref.eval_metric)]
    lose = [r for r in runs if r not in recover]
    what = f"{ref.precision}'s {tolerance.name}"
    parts = []
    if lose:
        worst = ", ".join(f"{r.eval_metric:.4g}" for r in lose)
        parts.append(f"{', '.join(r.label for r in lose)} {'lose' if len(lose) > 1 else 'loses'} {what} ({worst} vs {ref.eval_metric:.4g})")
    if not recover:
        return "16-bit weights: " + parts[0] + "; none recovers it: keep fp32 weights (a mixed policy)"
    parts.append(f"{', '.join(r.label for r in recover)} {'recover' if len(recover) > 1 else 'recovers'} it")
    measured = [r for r in recover if r.peak_memory_bytes is not None]
    if measured:
        lean = min(measured, key=lambda r: r.peak_memory_bytes or 0)
        others = "; ".join(f"{r.label} {fmt_bytes(r.peak_memory_bytes)}" for r in measured if r is not lean)
        parts.append(f"the leanest that does: {lean.label} (peak {fmt_bytes(lean.peak_memory_bytes)}" + (f"; {others})" if others else ")"))
    return "16-bit weights: " + "; ".join(parts)


def _stores_16_bit(precision: str) -> bool:
    try:
        return get_policy(precision).param_dtype != torch.float32
    except PolicyError:  # a run of a policy this ampkit does not know (an old results.json)
        return False
