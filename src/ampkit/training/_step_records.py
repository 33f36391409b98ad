"""What the optimizer step is given and what it gives back: :class:`StepSettings`, fixed when the engine is built,
and :class:`StepOutcome`, one per step (see :class:`~ampkit.training.OptimizerStep`).

    >>> StepSettings(clip_grad_norm=1.0).skip_nonfinite, StepOutcome(skipped=False, fused=False)
    (False, StepOutcome(skipped=False, fused=False))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["StepOutcome", "StepSettings"]


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What the step does besides stepping, fixed when the engine is built (``Engine(clip_grad_norm=...)``)."""

    clip_grad_norm: float | None = None
    """Clip the unscaled gradients to this total norm."""
    clip_grad_value: float | None = None
    """Clamp the unscaled gradients to this absolute value."""
    skip_nonfinite: bool = False
    """Check the gradients for inf/NaN and skip the step that has any."""


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
