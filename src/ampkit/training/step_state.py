"""Where an :class:`~ampkit.training.engine.Engine` run stands: the counters a checkpoint keeps, and the last step's outcome.

The counters (micro-batches into the epoch, the declared epoch length, optimizer steps) are saved and put back
by :mod:`ampkit.checkpoint.payload` through :meth:`StepState.to_dict` / :meth:`StepState.from_dict`, under the
checkpoint's own keys. The outcome fields describe the last optimizer step only; they are never saved, and a
load clears them, since they answer for a step the loaded run did not take here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["StepState"]


@dataclasses.dataclass(slots=True)
class StepState:
    """The engine's step counters and the outcome of its last optimizer step.

    >>> state = StepState(micro=5, epoch_len=8, steps=2, found_host=True)
    >>> state.to_dict()
    {'micro': 5, 'epoch_len': 8, 'steps': 2}
    >>> StepState.from_dict(state.to_dict())  # the outcome is not part of a checkpoint
    StepState(micro=5, epoch_len=8, steps=2, found_host=None, norm=None, deferred=None, diagnose_late=False)
    """

    micro: int = 0
    """Micro-batches since the epoch (or the run) began."""
    epoch_len: int | None = None
    """Micro-batches of the epoch declared by ``start_epoch``; None when none was."""
    steps: int = 0
    """Optimizer steps taken (skipped ones included)."""
    found_host: bool | None = None
    """Whether the last step found non-finite gradients, once read on the host; None before it is known."""
    norm: torch.Tensor | None = None
    """The last step's total gradient norm before clipping (on the device), when clipping by norm."""
    deferred: tuple[torch.Tensor, Any] | None = None
    """The last step's overflow flag still on its way to the host: (host tensor, event)."""
    diagnose_late: bool = False
    """An overflow learnt after its step: the next step diagnoses a scale collapse on its gradients."""

    def to_dict(self) -> dict[str, Any]:
        """The counters under the keys a checkpoint stores them by."""
        return {"micro": self.micro, "epoch_len": self.epoch_len, "steps": self.steps}

    @classmethod
    def from_dict(cls, counters: dict[str, Any]) -> StepState:
        """A state holding ``counters`` (as :meth:`to_dict` wrote them) and no step outcome, as a load leaves it."""
        return cls(micro=counters["micro"], epoch_len=counters["epoch_len"], steps=counters["steps"])


def delegate(field: str) -> property:
    """An attribute of the engine that reads and writes ``engine._state.<field>`` (names kept for its callers)."""

    def get(engine: Any) -> Any:
        return getattr(engine._state, field)

    def set_(engine: Any, value: Any) -> None:
        setattr(engine._state, field, value)

    return property(get, set_, doc=f"``StepState.{field}`` of this engine.")
