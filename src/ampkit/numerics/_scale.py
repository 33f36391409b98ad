"""The loss scale that keeps a model's gradients inside fp16, and the underflow it leaves.

Multiplying the loss by ``2^k`` multiplies every gradient of the backward pass by ``2^k`` (the chain rule is
linear), so the gradients measured in an fp32 reference run tell exactly which ``k`` is safe: the largest one
whose largest gradient stays at or below fp16's 65504. What still falls below 2^-24 at that scale is read off
the same exponent histogram, shifted by ``k`` bins. A dynamic scaler started there need not spend its first
steps backing off (too high) or lose small gradients for thousands of steps before it grows (too low).

    >>> from ampkit.numerics._stats import StatsAccumulator
    >>> acc = StatsAccumulator(rounding=False); acc.update(torch.tensor([2.0**-30, 2.0**-3]))
    >>> advice = recommend_loss_scale(acc.summary())
    >>> advice.log2, advice.underflow_unscaled, advice.underflow_scaled   # 2^-3 * 2^18 = 32768 <= 65504
    (18, 0.5, 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._formats import FP16, Format
from ._stats import TensorStats

__all__ = ["NO_GRADIENT_LOG2", "LossScaleAdvice", "largest_safe_log2", "recommend_loss_scale"]

NO_GRADIENT_LOG2 = 16
"""Scale exponent recommended when no gradient was seen at all (nothing to overflow): torch's default 2^16."""


@dataclass(frozen=True, slots=True)
class LossScaleAdvice:
    """The recommended loss scale ``2^log2`` for ``fmt`` and what it leaves below the format's range."""

    log2: int
    max_abs: float
    """Largest unscaled gradient magnitude seen."""
    underflow_unscaled: float
    """Share of gradient values below the format's smallest subnormal without scaling."""
    underflow_scaled: float
    """The same share at the recommended scale."""
    subnormal_scaled: float
    """Share of gradient values left subnormal (fewer significant bits) at the recommended scale."""
    fmt: str = "fp16"

    @property
    def scale(self) -> float:
        return 2.0**self.log2


def largest_safe_log2(max_abs: float, fmt: Format = FP16) -> int:
    """The largest ``k`` with ``max_abs * 2^k <= fmt.max``; :data:`NO_GRADIENT_LOG2` when ``max_abs`` is 0.

    >>> largest_safe_log2(1.0), largest_safe_log2(65504.0), largest_safe_log2(65505.0)
    (15, 0, -1)
    """
    if not math.isfinite(max_abs):
        raise ValueError(f"the largest gradient is {max_abs}: the fp32 reference itself is not finite, so no loss scale can help.")
    if max_abs <= 0:
        return NO_GRADIENT_LOG2
    k = math.floor(math.log2(fmt.max / max_abs))
    # log2 of a ratio can land a hair off an integer; settle k exactly with power-of-two products (exact in fp64).
    while math.ldexp(max_abs, k + 1) <= fmt.max:
        k += 1
    while math.ldexp(max_abs, k) > fmt.max:
        k -= 1
    return k


def recommend_loss_scale(gradients: TensorStats, fmt: Format = FP16, *, max_abs: float | None = None) -> LossScaleAdvice:
    """The largest power-of-two loss scale under which no gradient in ``gradients`` overflows ``fmt``.

    ``gradients`` should hold every gradient the 16-bit backward pass produces: parameter gradients and the
    activation gradients flowing between layers (either can be the one that overflows). ``max_abs``: the largest
    gradient, where ``gradients`` holds a subset for its shares (each value counted once) and a larger one lies
    outside it; default ``gradients.max_abs``.
    """
    largest = gradients.max_abs if max_abs is None else max(max_abs, gradients.max_abs)
    k = largest_safe_log2(largest, fmt)
    count = gradients.count or 1
    return LossScaleAdvice(
        log2=k,
        max_abs=largest,
        underflow_unscaled=gradients.underflow(fmt) / count,
        underflow_scaled=gradients.underflow(fmt, k) / count,
        subnormal_scaled=gradients.subnormal(fmt, k) / count,
        fmt=fmt.name,
    )


# torch is imported for the doctest namespace (pytest's doctest-modules runs examples in the module's globals).
_ = torch
