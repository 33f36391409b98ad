"""From statistics to a prescription: the modules to keep in fp32, the loss scale, and the policy to use.

Statistics of the fp32 run say where trouble should be; a step under the policy says where it is. So each
candidate policy is *tailored* by experiment (:func:`tailor`): start from the modules whose activations
overflow the policy's 16-bit format in the reference, run one step under the policy with those kept in fp32,
and while the step goes non-finite, keep the module where it began (the innermost one whose output went
inf/NaN from finite inputs) and try again. A finite step whose gradients still diverge from fp32 gets its worst
module kept in fp32 too, if (and only if) that brings the module back in line. Then :func:`choose_precision`
picks among the tailored candidates: the first in order of preference (bf16 before fp16: no loss scale to
manage, fp32's exponent range) whose step is finite and agrees with fp32, else the one that diverges least.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..policy import get_policy
from ._compare import LossFn, ReferenceStep, StepComparison, compare_step
from ._formats import format_of
from ._stats import TensorStats

__all__ = ["Tailored", "tailor", "overflowing_modules", "candidate_precisions", "choose_precision", "PREFERENCE"]

PREFERENCE = ("bf16-mixed", "16-mixed")
"""Policies the doctor chooses between when not told, most preferred first."""
MAX_ROUNDS = 8
"""Steps tried per policy while tailoring: enough for a few fragile layers without running for ever."""
MIN_LOG2 = -16
"""The loss scale is never lowered below 2^-16 while looking for a finite backward."""


@dataclass
class Tailored:
    """A policy with the fp32 modules and loss scale the doctor settled on, and the step that justifies them."""

    precision: str
    keep_fp32: list[str]
    loss_scale_log2: int | None
    """None for policies that do not scale the loss (bf16)."""
    comparison: StepComparison
    notes: list[str] = field(default_factory=list)
    """What each round found and changed, in order."""

    @property
    def agrees(self) -> bool:
        return self.comparison.finite and not self.comparison.diverging


def overflowing_modules(stats: dict[str, dict[str, TensorStats]], fmt: str, order: Sequence[str]) -> list[str]:
    """The named modules where values beyond ``fmt``'s range began in the reference run, in forward order.

    A module counts when its outputs exceeded the range and its inputs did not: a ReLU or norm after the layer
    that overflowed only passes the values on (whether it must run in fp32 too is for the step under the
    policy to show). A parent whose output is its child's would repeat the child; the root cannot be kept apart.

    >>> from ampkit.numerics._stats import StatsAccumulator
    >>> big = StatsAccumulator(); big.update(torch.tensor([1e6]))
    >>> s = {"block": {"outputs": big.summary()}, "block.fc": {"outputs": big.summary()}}
    >>> overflowing_modules(s, "fp16", ["block.fc", "block"])
    ['block.fc']
    """
    def exceeded(name: str, kind: str) -> bool:
        s = stats.get(name, {}).get(kind)
        return s is not None and s.overflow[fmt] > 0

    flagged = [n for n in order if n and exceeded(n, "outputs") and not exceeded(n, "inputs")]
    return [n for n in flagged if not any(other.startswith(n + ".") for other in flagged)]


def tailor(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    precision: str,
    *,
    reference: ReferenceStep,
    stats: dict[str, dict[str, TensorStats]],
    order: Sequence[str],
    loss_scale_log2: int,
) -> Tailored:
    """Find the ``keep_fp32`` (and, for fp16, the loss scale) under which ``precision`` trains this model.

    ``stats``/``order`` come from the fp32 reference run; ``loss_scale_log2`` is the scale its gradients allow.
    """
    policy = get_policy(precision)
    fmt = format_of(policy.compute_dtype or policy.param_dtype)
    scaled = policy.loss_scaling == "dynamic"
    k: int | None = loss_scale_log2 if scaled else None
    keep = overflowing_modules(stats, fmt.name, order) if fmt is not None else []
    notes = [f"start with {', '.join(keep)} in fp32: their outputs exceeded {fmt.name}'s range in the fp32 run"] if keep else []
    tried_for_divergence: set[str] = set()

    def run() -> StepComparison:
        return compare_step(model, batch, loss_fn, precision, keep_fp32=keep, reference=reference,
                            loss_scale=2.0**k if k is not None else None, label="recommended")

    comparison = run()
    for _ in range(MAX_ROUNDS):
        origin = comparison.forward_origin
        if origin is not None:
            if origin == "" or origin in keep:
                where = "the model's own forward (outside any submodule)" if origin == "" else f"{origin}, already in fp32"
                notes.append(f"non-finite values still arise in {where}: keep_fp32 cannot isolate them under {precision}")
                break
            keep.append(origin)
            notes.append(f"keep {origin} in fp32: its output went non-finite under {precision} from finite inputs")
        elif not comparison.finite and k is not None and k > MIN_LOG2:
            k -= 1
            notes.append(f"the backward overflowed at the scale the fp32 gradients allow; lower the scale to 2^{k}")
        elif comparison.finite and comparison.diverging:
            worst = next((n for n in comparison.diverging if n and n not in keep and n not in tried_for_divergence), None)
            if worst is None:
                break
            tried_for_divergence.add(worst)
            trial = compare_step(model, batch, loss_fn, precision, keep_fp32=[*keep, worst], reference=reference,
                                 loss_scale=2.0**k if k is not None else None, label="recommended")
            if trial.finite and worst not in trial.diverging:
                keep.append(worst)
                notes.append(f"keep {worst} in fp32: its gradient diverged from fp32 under {precision} and agrees once kept")
                comparison = trial
            continue
        else:
            break
        comparison = run()
    return Tailored(precision=precision, keep_fp32=keep, loss_scale_log2=k, comparison=comparison, notes=notes)


def candidate_precisions(device: torch.device) -> tuple[list[str], list[str]]:
    """(policies of :data:`PREFERENCE` that run fast on ``device``, why each other one does not).

    >>> fast, why = candidate_precisions(torch.device("cpu")); "16-mixed" in fast
    False
    """
    fast, reasons = [], []
    for name in PREFERENCE:
        support = get_policy(name).support(device)
        if support.supported and support.fast:
            fast.append(name)
        else:
            reasons.append(f"{name} is {'slow' if support.supported else 'unsupported'} on {device.type}: {support.reason}")
    return fast, reasons


def choose_precision(tailored: Sequence[Tailored]) -> Tailored | None:
    """The first tailored policy (in the order given) that is finite and agrees with fp32; else the finite one
    with the fewest diverging modules; None when no candidate trains finitely."""
    for t in tailored:
        if t.agrees:
            return t
    finite = [t for t in tailored if t.comparison.finite]
    return min(finite, key=lambda t: len(t.comparison.diverging)) if finite else None
