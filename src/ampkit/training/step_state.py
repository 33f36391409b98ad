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
    StepState(micro=5, epoch_len=8, steps=2, found_host=None, norm=None, deferred=None, diagnose_late=False, skipped=None)
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
    skipped: torch.Tensor | None = None
    """Optimizer steps skipped so far, counted on the device (no sync); set by the engine's setup."""

    def to_dict(self) -> dict[str, Any]:
        """The counters under the keys a checkpoint stores them by."""
        return {"micro": self.micro, "epoch_len": self.epoch_len, "steps": self.steps}

    @classmethod
    def from_dict(cls, counters: dict[str, Any]) -> StepState:
        """A state holding ``counters`` (as :meth:`to_dict` wrote them) and no step outcome, as a load leaves it."""
        return cls(micro=counters["micro"], epoch_len=counters["epoch_len"], steps=counters["steps"])

    # ------------------------------------------------------------------------------------------ the window
    def pending(self, accumulate: int) -> int:
        """Micro-batches accumulated since the last optimizer step; 0 at a window boundary.

        >>> StepState(micro=5).pending(accumulate=4)
        1
        """
        return self.micro % accumulate

    def window(self, accumulate: int) -> tuple[int, bool]:
        """(size of the current window, whether the current micro-batch ends it); an epoch's last may be short.

        >>> StepState(micro=8, epoch_len=10).window(accumulate=4)  # micro-batches 8 and 9 make the last window
        (2, False)
        """
        start = self.micro - self.pending(accumulate)
        size = accumulate if self.epoch_len is None else min(accumulate, self.epoch_len - start)
        return size, self.micro + 1 - start >= size

    def load_counters(self, counters: dict[str, Any], skipped_steps: int) -> None:
        """Take ``counters`` (as :meth:`to_dict` wrote them) and the skipped count; forget the last step's outcome."""
        fresh = StepState.from_dict(counters)
        fresh.skipped = self.skipped
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(fresh, field.name))
        if self.skipped is not None:
            self.skipped.fill_(int(skipped_steps))

    # ------------------------------------------------------------------------------------------ outcome
    def record_outcome(self, any_found: torch.Tensor | None, host_found: list[bool] | None) -> None:
        """Note a step's overflow flag: read already (``host_found``), or to be read later without a sync.

        >>> state = StepState(skipped=torch.zeros((), dtype=torch.int64))
        >>> state.record_outcome(torch.ones(()), [True]); state.found_host, int(state.skipped)
        (True, 1)
        """
        self.deferred = None
        if any_found is None:
            self.found_host = False
            return
        self.skipped.add_((any_found > 0).to(torch.int64))  # type: ignore[union-attr]
        if host_found is not None:
            self.found_host = any(host_found)
        else:
            self.found_host = None
            self._defer(any_found)

    def _defer(self, any_found: torch.Tensor) -> None:
        # Copy the flag to pinned host memory behind an event: by the next optimizer step the copy has long
        # landed, so reading it waits for nothing queued after this step (unlike .item(), which drains the stream).
        # Only CUDA gets the pinned copy and the event: another device's non-blocking copy would leave nothing
        # to wait on before reading, so there the copy is a plain (synchronous) one.
        on_cuda = any_found.device.type == "cuda"
        host = torch.empty((), dtype=any_found.dtype, pin_memory=on_cuda)
        host.copy_(any_found, non_blocking=on_cuda)
        event = None
        if on_cuda:
            # On the stream of the flag's own device, which ran the copy: the current device may be another
            # GPU (a model on cuda:1 without torch.cuda.set_device), whose stream would not order after it.
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(any_found.device))
        self.deferred = (host, event)

    def resolve_deferred(self) -> bool:
        """Read a deferred flag (waiting only for its own copy); True when this found the step skipped.

        A skipped step learnt this way is diagnosed for collapse at the start of the next optimizer step
        (``diagnose_late``): the scaler still holds the state that step left, and the gradients at hand are the
        ones to name (a persistent overflow shows in them too), whereas right after a step they were zeroed.
        """
        if self.deferred is None:
            return False
        host, event = self.deferred
        if event is not None:
            event.synchronize()
        self.deferred = None
        self.found_host = bool(host.item())
        self.diagnose_late = self.found_host
        return self.found_host
