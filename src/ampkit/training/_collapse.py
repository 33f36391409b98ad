"""A collapsed loss scale, diagnosed on the gradients at hand and reported once per episode.

When the dynamic scale has shrunk to its floor, or overflows step after step, training makes no progress and a
log line per skipped step would flood the log. :class:`CollapseWatch` turns the scaler's reason into a message
naming the parameters whose gradients are not finite, raises it or warns once per episode (a run of skipped
steps), and starts a new episode after a clean step. The engine and the Apex-compatible session both use it.

    >>> from ampkit.scaling import DynamicLossScaler, ScalerConfig
    >>> scaler = DynamicLossScaler(ScalerConfig(init_scale=1.0, min_scale=1.0, on_collapse="warn"))
    >>> watch = CollapseWatch()
    >>> for _ in range(3):
    ...     scaler.update(torch.ones(()))           # three overflows at the floor
    >>> message = watch.diagnose(scaler, [("w", torch.tensor([float("inf")]))], "fp16")
    >>> "w" in message
    True
    >>> said = []
    >>> watch.report(message, raise_error=False, say=said.append); watch.report(message, raise_error=False, say=said.append)
    >>> len(said)                                   # once per episode
    1
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._errors import LossScaleCollapseError
from ..scaling._diagnosis import collapse_message, nonfinite_parameters
from ..scaling._protocol import StepScaler

__all__ = ["CollapseWatch"]

log = logging.getLogger("ampkit")


class CollapseWatch:
    """Diagnoses a collapsed loss scale and reports it once per run of skipped steps."""

    def __init__(self) -> None:
        self.reported = False
        """Whether the current episode was reported already."""

    def diagnose(self, scaler: StepScaler | None, named_params: Iterable[tuple[str, torch.Tensor]], policy: str) -> str | None:
        """The message for a collapsed ``scaler`` (naming the non-finite parameters), or None when it has not collapsed."""
        reason = scaler.collapse_reason() if scaler is not None else None
        if reason is None:
            return None
        return collapse_message(reason, nonfinite_parameters(named_params), policy)

    def report(self, message: str | None, *, raise_error: bool, say: Callable[[str], Any] = log.warning) -> None:
        """Raise :class:`~ampkit.LossScaleCollapseError`, or ``say`` the message once per episode."""
        if message is None:
            return
        if raise_error:
            raise LossScaleCollapseError(message)
        if not self.reported:  # a stuck scale must not flood the log
            say(message)
            self.reported = True

    def clean_step(self) -> None:
        """A step without overflow ends the episode: the next collapse is reported again."""
        self.reported = False
