"""Where each training step's time goes, phase by phase, timed at the engine's step hooks.

A :class:`PhaseTimer` joins an :class:`~ampkit.Engine` as a step hook and stamps the moments the engine passes:
the forward's start and end (``wrap_forward``), the backward's (``before_backward``/``after_backward``) and the
optimizer step's (``before_optimizer_step``/``after_optimizer_step``). A step's time splits into

* ``data``: the wait for the batch (the DataLoader's). A loop that reads its batches through
  :meth:`PhaseTimer.batches` has it timed alone; otherwise it is all the time from the end of the previous
  micro-batch's work to the start of this forward, the loop's own code in between included;
* ``copy``: the batch's copy to the device (read through :meth:`PhaseTimer.batches`; otherwise part of ``data``);
* ``forward``, ``backward``, ``optimizer``: inside the engine's calls;
* ``other``: the rest: the loop's own code (logging, a read-back, the loss computed outside the engine's autocast
  context, code between backward and step) and the engine's unscale and overflow check before the optimizer hooks.

On the CPU every op runs before the call returns, so host stamps are the phases' times. On CUDA the host only
queues kernels: the timer also records a CUDA event at each stamp (no synchronisation in the step) and reads the
device's times when asked for them, once, at the end.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> timer = PhaseTimer()
    >>> engine = Engine(hooks=[timer])
    >>> model = nn.Linear(4, 1); model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> for _ in range(3):
    ...     with engine.autocast():
    ...         loss = model(torch.ones(2, 4)).sum()
    ...     engine.backward(loss); _ = engine.step()
    >>> [s.steps for s in timer.steps()], list(timer.steps()[0].phases)
    ([1, 1], ['data', 'copy', 'forward', 'backward', 'optimizer', 'other'])
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .._util.model_io import to_device
from ..training._hooks import StepHook

if TYPE_CHECKING:
    from ..training._engine import Engine

__all__ = ["PHASES", "PhaseTimer", "StepPhases"]

PHASES = ("data", "copy", "forward", "backward", "optimizer", "other")
"""The phases of a step, in the order they happen."""


@dataclass
class StepPhases:
    """One optimizer step's time per phase (seconds, summed over its micro-batches) and its total."""

    steps: int
    """Optimizer steps this covers (1 for a step of :meth:`PhaseTimer.steps`)."""
    phases: dict[str, float] = field(default_factory=dict)
    total: float = 0.0


class PhaseTimer(StepHook):
    """A step hook that times each step's phases (see the module's docstring); ``steps()`` reads them.

    The first step has no "previous end", so its data phase is not measured: ``steps()`` starts at the second.
    """

    def __init__(self) -> None:
        self._marks: list[tuple[str, float, Any]] = []  # (what, host time, CUDA event or None)
        self._cuda: torch.device | None = None
        self.paused = False
        """While paused nothing is recorded (see :meth:`pause`)."""

    def pause(self) -> None:
        """Stop recording: the steps from here until :meth:`resume` are not timed (nor kept in memory)."""
        self.paused = True

    def resume(self, device: torch.device | str = "cpu") -> None:
        """Record again, from a step boundary: call it between two steps (``device``: the loop's, for CUDA events).

            >>> timer = PhaseTimer(); timer.pause(); timer.resume()
            >>> timer.paused
            False
        """
        self.paused = False
        if torch.device(device).type == "cuda":
            self._cuda = torch.device(device)
        self._stamp("resumed", self._cuda is not None)

    # -- the hook side ----------------------------------------------------------------------------
    def _mark(self, what: str, engine: Engine) -> None:
        if engine.device.type == "cuda":
            self._cuda = engine.device
        self._stamp(what, self._cuda is not None)

    # -- the loop side ----------------------------------------------------------------------------
    def batches(self, loader: Iterable[Any], device: torch.device | str, *, non_blocking: bool = False, channels_last: bool = False) -> Iterator[Any]:
        """Each batch of ``loader`` copied to ``device``, with the wait for it timed as ``data`` and the copy as
        ``copy`` (``non_blocking`` as ``Tensor.to`` takes it: asynchronous from pinned memory).

            >>> timer = PhaseTimer()
            >>> [tuple(b.shape) for b in timer.batches([torch.ones(2, 3)], "cpu")]
            [(2, 3)]
        """
        device = torch.device(device)
        event = device.type == "cuda"
        batches = iter(loader)
        while True:
            # The loop asks for its next batch here: what it did since the step (logging, a read-back) is its own.
            self._stamp("fetching", event)
            try:
                batch = next(batches)
            except StopIteration:
                return
            self._stamp("fetched", event)
            on_device = to_device(batch, device, channels_last, non_blocking=non_blocking)
            self._stamp("copied", event)
            yield on_device

    def _stamp(self, what: str, event: bool) -> None:
        if self.paused:
            return
        cuda_event = None
        if event:
            cuda_event = torch.cuda.Event(enable_timing=True)
            cuda_event.record()
        self._marks.append((what, time.perf_counter(), cuda_event))

    def wrap_forward(self, engine: Engine, forward: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        return self._timed_forward(engine, forward)

    @contextlib.contextmanager
    def _timed_forward(self, engine: Engine, forward: AbstractContextManager[Any]) -> Iterator[None]:
        self._mark("forward_start", engine)
        with forward:
            yield
        self._mark("forward_end", engine)

    def before_backward(self, engine: Engine, loss: torch.Tensor) -> None:
        self._mark("backward_start", engine)

    def after_backward(self, engine: Engine) -> None:
        self._mark("backward_end", engine)

    def before_optimizer_step(self, engine: Engine) -> None:
        self._mark("optimizer_start", engine)

    def after_optimizer_step(self, engine: Engine) -> None:
        self._mark("optimizer_end", engine)

    # -- the reading side -------------------------------------------------------------------------
    def steps(self, device_time: bool = False) -> list[StepPhases]:
        """Each complete optimizer step after the first (and after each :meth:`resume`), its phases in seconds of host time, or of device time
        (CUDA events; one synchronisation) with ``device_time=True``."""
        if device_time:
            if self._cuda is None:
                raise ValueError("device_time=True needs a CUDA run: on the CPU the host's times are the device's.")
            torch.cuda.synchronize(self._cuda)
        out: list[StepPhases] = []
        current: StepPhases | None = None
        previous: tuple[str, float, Any] | None = None
        for mark in self._marks:
            what = mark[0]
            if what == "resumed":
                current = None  # a step cut by a pause is not whole: timing starts again from here
            elif previous is not None and (current is not None or previous[0] in ("optimizer_end", "resumed")):
                if current is None:
                    current = StepPhases(1, {p: 0.0 for p in PHASES})
                phase = _phase_between(previous[0], what)
                seconds = _elapsed(previous, mark, device_time)
                current.phases[phase] += seconds
                current.total += seconds
                if what == "optimizer_end":
                    out.append(current)
                    current = StepPhases(1, {p: 0.0 for p in PHASES})
            previous = mark
        return out


def _phase_between(before: str, after: str) -> str:
    if before == "fetched" and after == "copied":
        return "copy"
    if before == "fetching" and after == "fetched":
        return "data"
    if after == "forward_start" and before not in ("fetched", "copied"):
        return "data"  # a loop that does not read through batches(): its wait and its own code are one
    if before == "forward_start" and after == "forward_end":
        return "forward"
    if before == "backward_start" and after == "backward_end":
        return "backward"
    if before == "optimizer_start" and after == "optimizer_end":
        return "optimizer"
    return "other"


def _elapsed(start: tuple[str, float, Any], end: tuple[str, float, Any], device_time: bool) -> float:
    if device_time:
        return start[2].elapsed_time(end[2]) / 1e3
    return end[1] - start[1]
