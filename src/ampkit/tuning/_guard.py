"""The accuracy guard: a configuration is recommended only if it trains as well as fp32, judged against fp32's own noise.

Each finalist trains ``steps`` optimizer steps from the same initial weights on the same batches in the same
order as the **reference** (the user's starting configuration: fp32, their batch), as the bench trains them
(:func:`ampkit.tuning._trials.make_run`), and is scored by the workload's eval metric on its eval batches, or, without
an eval metric, by its final training loss (the mean of the last tenth of its steps, as ``ampkit bench`` states it).

**The reference's noise** is measured, not assumed: a second fp32 run differs from the reference only in the order
of its batches (a seeded permutation), and the gap between the two figures is what fp32 itself moves by when
nothing but chance changes. **The tolerance** is the larger of twice that gap (:data:`NOISE_FACTOR`) and the
metric's own stated tolerance (accuracy: 0.02 absolute; a relative one, such as perplexity's, of the reference's
figure; the loss without a metric: :data:`LOSS_TOLERANCE` of the reference loss). Only *worse* counts: a finalist
whose figure is worse than the reference's by more than the tolerance, or whose loss is not finite, is rejected,
and its reason names the gap, the tolerance and the noise it came from.

What it does not see: one noise draw is a rough scale, not an interval (a second permutation would narrow it at
the price of another run), and ``steps`` short of convergence judge the start of training only.

    >>> g = GuardResult(key="k", metric="accuracy", higher_is_better=True, value=0.5, reference=0.9, noise=0.01, tolerance=0.02)
    >>> g.gap, g.passed
    (0.4, False)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..workloads import Workload, to_device
from ._space import Candidate
from ._trials import make_run, threads

__all__ = ["LOSS_TOLERANCE", "NOISE_FACTOR", "GuardResult", "Reference", "judge", "reference"]

NOISE_FACTOR = 2.0
"""The tolerance is at least this many times the gap between two fp32 runs that differ only in batch order."""
LOSS_TOLERANCE = 0.02
"""Without an eval metric: the final training loss may be this fraction of the reference's worse (a floor, as the
bench's eval-loss tolerance is for a metric)."""


@dataclass
class Reference:
    """The fp32 reference's figure, its noise and the tolerance derived from it."""

    metric: str
    """The eval metric's name, or ``final_loss`` (no eval metric)."""
    higher_is_better: bool
    value: float
    reordered: float
    """The same fp32 configuration's figure with its batches in another order."""
    floor: float
    """The metric's own tolerance, in its units."""
    steps: int
    losses: list[float] = field(default_factory=list)
    """The reference's training loss per optimizer step."""
    reordered_losses: list[float] = field(default_factory=list)
    """The reordered twin's (the report's loss curves show both: fp32's noise beside the finalists)."""

    @property
    def noise(self) -> float:
        return abs(self.value - self.reordered)

    @property
    def tolerance(self) -> float:
        return max(self.floor, NOISE_FACTOR * self.noise)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "noise": self.noise, "tolerance": self.tolerance}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        return cls(**{k: v for k, v in data.items() if k not in ("noise", "tolerance")})


@dataclass
class GuardResult:
    """A finalist's figure against the reference's: its gap on the worse side, the tolerance, the verdict."""

    key: str
    metric: str
    higher_is_better: bool
    value: float
    reference: float
    noise: float
    tolerance: float
    losses: list[float] = field(default_factory=list)
    error: str | None = None
    same_arithmetic: bool = False
    """Only scheduling differs from the start (torch's threads, the DataLoader's settings): it computes what the start
    computes, so it passes with no run (:meth:`scheduling_only`), whatever the budget left."""

    @classmethod
    def scheduling_only(cls, key: str) -> GuardResult:
        """The result of a configuration that changes only when work runs, not what it computes: passed, no run.

        >>> g = GuardResult.scheduling_only("32-true mb8x1 compile=off")
        >>> g.passed, g.reason
        (True, None)
        """
        return cls(key, "none", False, 0.0, 0.0, 0.0, 0.0, same_arithmetic=True)

    @property
    def gap(self) -> float:
        """How much worse than the reference (negative: better), in the metric's units."""
        worse = self.reference - self.value if self.higher_is_better else self.value - self.reference
        return round(worse, 12)

    @property
    def passed(self) -> bool:
        if self.same_arithmetic:
            return True
        return self.error is None and math.isfinite(self.value) and self.gap <= self.tolerance

    @property
    def reason(self) -> str | None:
        """Why it was rejected (None when it passed)."""
        if self.error is not None:
            return f"failed in the accuracy guard: {self.error}"
        if not math.isfinite(self.value):
            return f"{self.metric} is not finite after the guard's steps: training diverged"
        if self.gap > self.tolerance:
            return (f"{self.metric} {self.value:.4g} is {self.gap:.3g} worse than fp32's {self.reference:.4g}, beyond the "
                    f"tolerance {self.tolerance:.3g} (fp32's own noise {self.noise:.3g})")
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "gap": self.gap, "passed": self.passed, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GuardResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _train(workload: Workload, candidate: Candidate, device: torch.device, steps: int, seed: int) -> tuple[float | None, float, dict[str, Any]]:
    """Train ``candidate`` for ``steps`` steps; (its eval metric or None, its final loss, the run's losses)."""
    run = make_run(workload, candidate, device, seed, steps)
    with threads(candidate.threads):
        run.build()
        run.train(steps, False)
        run.summarize()
        evals = [to_device(b, device, candidate.channels_last) for b in workload.eval_batches]
        run.evaluate(evals)
    run.release()
    r = run.result
    final = r.final_loss if r.final_loss is not None else float("nan")
    return r.eval_metric, final, {"losses": list(r.losses or [])}


def _figure(workload: Workload, metric: float | None, final_loss: float) -> float:
    return metric if _has_metric(workload) and metric is not None else final_loss


def _has_metric(workload: Workload) -> bool:
    return workload.metric is not None and bool(workload.eval_batches)


def reordered(workload: Workload, seed: int) -> Workload:
    """``workload`` with its training batches in another order (a permutation seeded by ``seed``)."""
    order = torch.randperm(len(workload.train_batches), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    if len(order) > 1 and order == sorted(order):
        order = order[1:] + order[:1]  # a permutation that happens to be the identity would measure no noise
    return dataclasses.replace(workload, train_batches=[workload.train_batches[i] for i in order])


def reference(
    workload: Workload, start: Candidate, device: torch.device, *, steps: int, seed: int = 0,
    progress: Callable[[str], None] = lambda what: None,
) -> Reference:
    """Train the reference (``start``) twice, the second time on reordered batches, and derive the tolerance."""
    progress("accuracy guard: fp32 reference")
    metric, loss, a = _train(workload, start, device, steps, seed)
    progress("accuracy guard: fp32 reference, batches reordered (its noise)")
    metric_b, loss_b, b = _train(reordered(workload, seed), start, device, steps, seed)
    value, other = _figure(workload, metric, loss), _figure(workload, metric_b, loss_b)
    if _has_metric(workload):
        m = workload.metric()  # type: ignore[misc]
        name, higher, floor = m.name, m.higher_is_better, m.tolerance * (abs(value) if m.relative else 1.0)
    else:
        name, higher, floor = "final_loss", False, LOSS_TOLERANCE * abs(value)
    return Reference(name, higher, value, other, floor, steps, a["losses"], b["losses"])


def judge(
    workload: Workload, candidate: Candidate, ref: Reference, device: torch.device, *, seed: int = 0,
    progress: Callable[[str], None] = lambda what: None,
) -> GuardResult:
    """Train ``candidate`` as the reference trained and hold its figure to the reference's tolerance."""
    progress(f"accuracy guard: {candidate.key}")
    try:
        metric, loss, data = _train(workload, candidate, device, ref.steps, seed)
        value, error = _figure(workload, metric, loss), None
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - a finalist that cannot train is rejected with its error
        from .._errors import one_line

        value, error, data = float("nan"), one_line(exc, with_type=True), {"losses": []}
    return GuardResult(candidate.key, ref.metric, ref.higher_is_better, value, ref.value, ref.noise, ref.tolerance, data["losses"], error)
