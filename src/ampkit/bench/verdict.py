"""Compare every run with the fp32 reference: speed-up, memory saved, eval metric within tolerance, a verdict.

    >>> from ampkit.bench.results import BenchResult, RunResult
    >>> ref = RunResult(precision="32-true", step_time_median_s=0.02, peak_memory_bytes=1000, eval_metric=0.95)
    >>> fast = RunResult(precision="bf16-mixed", step_time_median_s=0.01, peak_memory_bytes=600, eval_metric=0.94)
    >>> result = BenchResult(workload="digits", runs=[ref, fast])
    >>> apply_verdicts(result, Tolerance("accuracy", higher_is_better=True, tolerance=0.02, relative=False))
    >>> fast.verdict
    'bf16-mixed: 2.00x faster, 40% less memory, accuracy 0.94 within 0.02 of 32-true (0.95): pays on this model and device'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .results import BenchResult, RunResult

__all__ = ["Tolerance", "apply_verdicts", "SAME_SPEED", "PAYS_SPEEDUP", "PAYS_MEMORY"]

SAME_SPEED = 0.03
"""Speed differences under 3% are called "as fast": interleaved medians on a busy 2-core CPU vary by about 2%."""
PAYS_SPEEDUP = 1.05
"""A policy pays when its eval metric is within tolerance and it is at least 5% faster than fp32 ..."""
PAYS_MEMORY = 0.10
"""... or as fast while saving at least 10% of fp32's memory. Slower but leaner "trades speed for memory"."""


@dataclass(frozen=True)
class Tolerance:
    """How far from the reference's eval metric a run may land and still count as equal."""

    name: str
    higher_is_better: bool
    tolerance: float
    relative: bool

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


def _speed_words(speedup: float) -> str:
    if abs(speedup - 1.0) < SAME_SPEED:
        return f"as fast ({speedup:.2f}x)"
    return f"{speedup:.2f}x faster" if speedup > 1 else f"{1 / speedup:.2f}x slower"


def _memory_words(saved: float) -> str:
    if abs(saved) < 0.005:
        return "same memory"
    return f"{saved:.0%} less memory" if saved > 0 else f"{-saved:.0%} more memory"


def _compare(run: RunResult, ref: RunResult, tol: Tolerance | None) -> None:
    if run.step_time_median_s and ref.step_time_median_s:
        run.speedup_vs_fp32 = ref.step_time_median_s / run.step_time_median_s
    if run.peak_memory_bytes is not None and ref.peak_memory_bytes:
        run.memory_saved_vs_fp32 = 1.0 - run.peak_memory_bytes / ref.peak_memory_bytes
    if tol is not None:
        run.within_tolerance = tol.within(run.eval_metric, ref.eval_metric)


def _verdict(run: RunResult, ref: RunResult, tol: Tolerance | None) -> str:
    if not run.ok:
        return f"{run.precision}: {run.status}: {run.error or 'no figures'}"
    parts = []
    if run.speedup_vs_fp32 is not None:
        parts.append(_speed_words(run.speedup_vs_fp32))
    if run.memory_saved_vs_fp32 is not None:
        parts.append(_memory_words(run.memory_saved_vs_fp32))
    if tol is not None and run.eval_metric is not None and ref.eval_metric is not None:
        amount = f"{tol.tolerance:.0%}" if tol.relative else f"{tol.tolerance:g}"
        where = "within" if run.within_tolerance else "OUTSIDE"
        parts.append(f"{tol.name} {run.eval_metric:.4g} {where} {amount} of {ref.precision} ({ref.eval_metric:.4g})")
    if run.status == "diverged":
        return f"{run.precision}: {', '.join(parts)}: the loss diverged: does not pay"
    speedup = run.speedup_vs_fp32 if run.speedup_vs_fp32 is not None else 1.0
    leaner = (run.memory_saved_vs_fp32 or 0.0) >= PAYS_MEMORY
    if run.within_tolerance is False:
        outcome = "does not pay"
    elif speedup >= PAYS_SPEEDUP or (leaner and speedup > 1.0 - SAME_SPEED):
        outcome = "pays"
    elif leaner:
        outcome = "trades speed for memory"  # slower, but it may be what lets a model fit at all
    else:
        outcome = "does not pay"
    return f"{run.precision}: {', '.join(parts)}: {outcome} on this model and device"


def apply_verdicts(result: BenchResult, tolerance: Tolerance | None) -> None:
    """Fill speed-up, memory saved, within-tolerance and verdict of every run against ``result.reference``."""
    ref = result.run(result.reference)
    if tolerance is not None:
        result.eval_tolerance = tolerance.describe(result.reference)
    for run in result.runs:
        if ref is None or not ref.ok:
            run.verdict = f"{run.precision}: no {result.reference} reference to compare with" if run.ok else _verdict(run, run, None)
            continue
        _compare(run, ref, tolerance)
        run.verdict = f"{run.precision}: the fp32 reference" if run is ref else _verdict(run, ref, tolerance)
