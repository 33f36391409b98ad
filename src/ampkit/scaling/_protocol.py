"""What the optimizer step needs of a loss scaler: the seam between :mod:`ampkit.training._optimizer_step` and scaling.

:class:`~ampkit.scaling.LossScaler` (dynamic and static) implements it; any object with these members can be
passed as ``Engine(scaler=...)``. ``torch.amp.GradScaler`` cannot: it unscales an optimizer's gradients, not a list
of them, and decides the skip itself inside ``scaler.step(optimizer)``, where the engine's step must decide it once
for every optimizer (and every rank) it steps; the engine refuses it, naming the equivalent ``ScalerConfig``.

Everything here runs on the device without a host sync except :meth:`StepScaler.get_scale`,
:meth:`StepScaler.collapse_reason` and :meth:`StepScaler.state_dict`, which the step calls only when asked (a
property read, a skipped step, a checkpoint).

    >>> from ampkit.scaling import DynamicLossScaler, StaticLossScaler
    >>> isinstance(DynamicLossScaler(), StepScaler), isinstance(StaticLossScaler(), StepScaler)
    (True, True)
    >>> StaticLossScaler().on_collapse
    'raise'
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import torch

__all__ = ["StepScaler"]


@runtime_checkable
class StepScaler(Protocol):
    """A loss scaler as the optimizer step uses it (see the module docstring)."""

    @property
    def scale_tensor(self) -> torch.Tensor:
        """The current scale, a 0-dim float32 tensor on the device (what fused optimizers take as ``grad_scale``)."""
        ...

    @property
    def on_collapse(self) -> Literal["raise", "warn"]:
        """What the step does when :meth:`collapse_reason` names a collapse: raise, or warn once per episode."""
        ...

    def to(self, device: torch.device | str) -> object:
        """Move the scaler's state to ``device``, in place (setup does, once); what it returns is not used."""
        ...

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale."""
        ...

    def inv_scale(self) -> torch.Tensor:
        """The reciprocal of the scale as a 0-dim float32 device tensor."""
        ...

    def unscale_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        """Divide ``grads`` by the scale in place; record any inf/NaN in ``found_inf``."""
        ...

    def check_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        """Record inf/NaN of ``grads`` in ``found_inf`` without unscaling (a fused optimizer unscales them)."""
        ...

    def update(self, found_inf: torch.Tensor) -> None:
        """Adjust the scale after a step; ``found_inf`` > 0: its gradients were not finite."""
        ...

    def get_scale(self) -> float:
        """The scale as a Python float (syncs)."""
        ...

    def collapse_reason(self) -> str | None:
        """Why scaling cannot go on helping (asked after a skipped step), or None."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume scaling exactly (with a ``"kind"`` entry checkpoints compare)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        ...
