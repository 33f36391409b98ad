"""Is a policy's eval metric worse than the reference's? One-sided, against the tolerance and the measured noise.

Only *worse* matters: a policy that lands better than ``32-true`` has lost nothing. Each run's gap to the reference
(how much worse, in the metric's own units) is held to the larger of two margins:

- the **tolerance** (:class:`Tolerance`): how far from the reference counts as equal, absolute (accuracy, mIoU, eval
  loss) or a fraction of the reference's figure (perplexity);
- the **eval noise** (:class:`EvalNoise`, :func:`paired_eval_noise`): the sampling error of a comparison on this
  eval set. The bench scores every eval batch alone as well (``RunResult.eval_batch_metrics``, no extra forward
  pass); each run's per-batch differences from the reference (paired: a batch's difficulty cancels) give a
  variance, pooled over the runs, and the standard error is that over the number of batches; its 95% band is that
  times Student's t. A gap inside the band is a difference this eval set cannot resolve. It is free; a second
  fp32 seed would measure the training noise too, at the price of a whole extra training run, which the bench
  does not pay.

What the eval noise does not see is the training noise: policies that round differently follow different
trajectories, and on a short run those land apart either way. A change of precision does not make a model
better, so a policy that lands **better** than the reference beyond both margins shows that noise: the comparison
is noisy, and a gap on the worse side no larger than that spread is **unclear**, not a loss.

The words (:data:`QUALITY`), defined once here and printed with their definitions:

    >>> tol = Tolerance("perplexity", higher_is_better=False, tolerance=0.02, relative=True)
    >>> judged = judge([7.25, 6.9, 7.5, 7.9], reference=7.3, tolerance=tol, noise=None)
    >>> [j.word for j in judged.runs], f"{judged.spread:.3f}"
    (['as good', 'better', 'unclear', 'worse'], '0.400')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._util.values import check_tolerance

__all__ = ["QUALITY", "EvalNoise", "Judged", "Judgement", "Tolerance", "check_tolerance", "judge", "metric_words", "paired_eval_noise", "t_975"]

QUALITY: dict[str, str] = {
    "as good": "within the tolerance of 32-true's figure, or within its eval noise, either way",
    "better": "better than 32-true beyond the tolerance and the eval noise: no failure, but a change of precision does "
    "not make a model better, so the comparison is noisy (training noise: rerun with more --steps or another --seed)",
    "unclear": "worse than 32-true beyond the tolerance and the eval noise, but by no more than another policy of "
    "this run landed better: within the run's own spread",
    "worse": "worse than 32-true beyond the tolerance, the eval noise and the run's spread: quality is lost",
}
"""The eval metric against the reference's, one word per run (``RunResult.quality``); None: not measured."""

_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
          2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Student's t at 97.5% for 1 to 30 degrees of freedom (torch and numpy have no t quantile; scipy is optional)."""


_Z_975 = 1.959964
"""The normal distribution's 97.5% quantile: Student's t for infinitely many degrees of freedom."""


def t_975(df: int) -> float:
    """Student's t quantile at 97.5% (a two-sided 95% band) for ``df`` degrees of freedom.

    >>> t_975(4), round(t_975(1000), 3)
    (2.776, 1.962)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T_975):
        return _T_975[df - 1]
    # Beyond the table, the first term of the expansion of t in 1/df (Cornish-Fisher): within 0.2% from df 31 on.
    return _Z_975 + (_Z_975**3 + _Z_975) / (4 * df)


def metric_words(name: str) -> str:
    """A metric's name as words: ``eval_loss`` reads ``eval loss``, ``mIoU`` stays ``mIoU``.

    >>> metric_words("eval_loss"), metric_words("pixel_accuracy"), metric_words("mIoU")
    ('eval loss', 'pixel accuracy', 'mIoU')
    """
    return name.replace("_", " ")


@dataclass(frozen=True)
class Tolerance:
    """How far from the reference's eval metric a run may land, on the worse side, and still count as equal."""

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

    def allowed(self, reference: float) -> float:
        """The tolerance in the metric's units, for a reference figure ``reference``."""
        return self.tolerance * abs(reference) if self.relative else self.tolerance

    def worse_by(self, value: float, reference: float) -> float:
        """How much worse ``value`` is than ``reference``, in the metric's units; negative when it is better.

        >>> Tolerance("accuracy", True, 0.02, False).worse_by(0.88, 0.9), Tolerance("perplexity", False, 0.02, True).worse_by(7.0, 7.5)
        (0.020000000000000018, -0.5)
        """
        return reference - value if self.higher_is_better else value - reference

    def amount(self) -> str:
        """The tolerance as written: ``0.02`` or ``2%``."""
        return f"{self.tolerance * 100:g}%" if self.relative else f"{self.tolerance:g}"

    def size(self, gap: float, reference: float) -> str:
        """A gap (or band) in the tolerance's terms: ``4.8%`` of the reference when relative, else the figure."""
        return f"{abs(gap) / abs(reference):.1%}" if self.relative and reference else f"{abs(gap):.3g}"

    def describe(self, reference: str) -> str:
        """The tolerance in words, e.g. ``accuracy within 0.02 of 32-true``."""
        return f"{metric_words(self.name)} within {self.amount()} of {reference}"


@dataclass(frozen=True)
class EvalNoise:
    """An eval sampling error: a standard error over ``batches`` eval batches, with ``dof`` degrees of freedom."""

    standard_error: float
    batches: int
    dof: int | None = None
    """Student's t degrees of freedom; None: ``batches - 1`` (one sample). Pooled over runs, each adds its own."""
    runs: int = 1
    """How many runs' per-batch differences were pooled (:func:`paired_eval_noise`)."""

    @property
    def band(self) -> float:
        """The 95% half-width: Student's t for :attr:`dof` times the standard error."""
        return t_975(self.dof if self.dof is not None else self.batches - 1) * self.standard_error


def paired_eval_noise(reference: Sequence[float | None], others: Sequence[Sequence[float | None]]) -> EvalNoise | None:
    """The eval noise of comparing runs with the reference on one eval set: paired, batch by batch.

    Every run is scored on the same eval batches, so how hard each batch is cancels in a run's per-batch
    difference from the reference; the reference's own spread over its batches does not cancel it, and on the
    gpt workload (32 batches of different text) made a band of 14% of perplexity around a 2% tolerance. The
    variance of each run's per-batch differences is pooled over the runs (a run's mean gap, its real effect, does
    not enter its variance), and the standard error is that over the number of batches, with one degree of freedom
    per batch per run less one per run. None with fewer than 2 batches or no run scored on the same batches.

    >>> noise = paired_eval_noise([0.80, 0.95, 0.90, 0.70], [[0.79, 0.95, 0.88, 0.70]])  # hard and easy batches alike
    >>> round(noise.standard_error, 4), noise.dof, noise.runs
    (0.0048, 3, 1)
    >>> paired_eval_noise([0.9], [[0.8]]) is None
    True
    """
    ref = np.asarray([math.nan if v is None else v for v in reference], dtype=float)
    if len(ref) < 2 or not np.isfinite(ref).all():
        return None
    variances = []
    for other in others:
        run = np.asarray([math.nan if v is None else v for v in other], dtype=float)
        if len(run) == len(ref) and np.isfinite(run).all():
            variances.append(float(np.var(run - ref, ddof=1)))
    if not variances:
        return None
    n = len(ref)
    return EvalNoise(math.sqrt(float(np.mean(variances)) / n), n, dof=len(variances) * (n - 1), runs=len(variances))


@dataclass(frozen=True)
class Judgement:
    """One run's eval metric against the reference's."""

    word: str | None
    """A :data:`QUALITY` word; None when either figure is missing (quality not measured)."""
    worse_by: float | None
    """How much worse than the reference, in the metric's units (negative: better; inf: not finite)."""


@dataclass(frozen=True)
class Judged:
    """Every run's :class:`Judgement`, and the run's spread: how far the furthest ``better`` run landed better."""

    runs: list[Judgement]
    spread: float
    """0.0 when no run landed better beyond the tolerance and the eval noise."""
    best: int | None
    """Index (in ``runs``) of the run that set ``spread``; None when it is 0."""


def judge(values: Sequence[float | None], reference: float | None, tolerance: Tolerance, noise: EvalNoise | None) -> Judged:
    """Judge each of ``values`` against ``reference`` by the rule of this module's docstring."""
    if reference is None or not math.isfinite(reference):
        return Judged([Judgement(None, None) for _ in values], 0.0, None)
    floor = max(tolerance.allowed(reference), noise.band if noise is not None else 0.0) + 1e-12
    gaps = [None if v is None else (tolerance.worse_by(v, reference) if math.isfinite(v) else math.inf) for v in values]
    better = [i for i, g in enumerate(gaps) if g is not None and g < -floor]
    best = min(better, key=lambda i: gaps[i]) if better else None  # the first of equals: the order runs are listed in
    spread = -gaps[best] if best is not None else 0.0  # type: ignore[operator]
    runs = []
    for gap in gaps:
        if gap is None:
            word = None
        elif gap < -floor:
            word = "better"
        elif gap <= floor:
            word = "as good"
        else:
            word = "unclear" if gap <= spread else "worse"
        runs.append(Judgement(word, gap))
    return Judged(runs, spread, best)
