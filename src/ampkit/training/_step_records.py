"""What the optimizer step is given and what it gives back: :class:`StepSettings`, fixed when the engine is built,
and :class:`StepOutcome`, one per step (see :class:`~ampkit.training.OptimizerStep`).

    >>> StepSettings(clip_grad_norm=1.0).skip_nonfinite, StepOutcome(skipped=False, fused=False)
    (False, StepOutcome(skipped=False, fused=False))
    >>> StepSettings(on_nonfinite="raise")
    Traceback (most recent call last):
    ...
    ValueError: StepSettings(on_nonfinite='raise') needs skip_nonfinite=True: a step whose gradients are not checked is never found to be skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

__all__ = ["NonFiniteReport", "StepOutcome", "StepSettings"]

NonFiniteReport = Literal["quiet", "warn", "raise"]
"""What a skipped step is reported as: ``"quiet"`` (a loss scaler's overflow, part of its work: logged at DEBUG),
``"warn"`` (a WARNING naming the step) or ``"raise"`` (FloatingPointError naming the step, once it is complete)."""


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What the step does besides stepping, fixed when the engine is built (``Engine(clip_grad_norm=...)``)."""

    clip_grad_norm: float | None = None
    """Clip the unscaled gradients to this total norm."""
    clip_grad_value: float | None = None
    """Clamp the unscaled gradients to this absolute value."""
    skip_nonfinite: bool = False
    """Check the gradients for inf/NaN and skip the step that has any."""
    on_nonfinite: NonFiniteReport = "quiet"
    """How a skipped step is reported (see :data:`NonFiniteReport`); ``"raise"`` reads each step's flag on the host."""
    skip_asked: bool = True
    """The check was asked for (``skip_nonfinite=True``) or comes with loss scaling; False where it is only the
    default safety net of an unscaled policy, which a plain ``optimizer.step()`` loop may do without."""

    def __post_init__(self) -> None:
        if self.on_nonfinite not in ("quiet", "warn", "raise"):
            raise ValueError(f"StepSettings(on_nonfinite={self.on_nonfinite!r}): pass 'quiet', 'warn' or 'raise'.")
        if self.on_nonfinite != "quiet" and not self.skip_nonfinite:
            raise ValueError(f"StepSettings(on_nonfinite={self.on_nonfinite!r}) needs skip_nonfinite=True: a step whose gradients are not checked is never found to be skipped.")


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one optimizer step did, as far as the host knows without waiting for the device.

    >>> StepOutcome(skipped=None, fused=True)  # a fused optimizer's flag still on its way to the host
    StepOutcome(skipped=None, fused=True)
    """

    skipped: bool | None
    """True: the gradients were not finite and nothing was updated; None: not known yet on the host (the flag is on
    its way; ``Engine.step_was_skipped`` waits for it)."""
    fused: bool
    """The compiled master-weight region took the step (see :mod:`~ampkit.training._fused_master_step`)."""
    found: torch.Tensor | None = field(default=None, repr=False)
    """The step's overflow flag on the device (> 0: skipped); None where gradients are not checked."""
    norm: torch.Tensor | None = field(default=None, repr=False)
    """The total gradient norm before clipping, on the device (with ``clip_grad_norm``)."""
