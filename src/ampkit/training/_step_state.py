"""Where an :class:`~ampkit.training.Engine` run stands: the counters a checkpoint keeps, and the last step's outcome.

The counters (micro-batches into the epoch, the declared epoch length, optimizer steps) are saved and put back
by :mod:`ampkit.checkpoint._payload` through :meth:`StepState.to_dict` / :meth:`StepState.from_dict`, under the
checkpoint's own keys. The outcome fields describe the last optimizer step only; they are never saved, and a
load clears them, since they answer for a step the loaded run did not take here.

Two owners write it, each its own fields and only through these methods: the engine's loop the counters
(:meth:`StepState.end_micro_batch`, :meth:`StepState.start_epoch`, :meth:`StepState.load_counters`,
:meth:`StepState.discard_window`), the optimizer step (:class:`~ampkit.training.OptimizerStep`) the
outcome (``norm``, ``diagnose_late``, :meth:`StepState.record_outcome`, :meth:`StepState.poll`).

A step that nothing forced to read its overflow flag (a fused optimizer on an accelerator) sends the flag to the
host with one copy into a pinned slot behind an event, and the host reads it once the copy has landed, at a later
step, without waiting: the step makes no host-device sync, as torch's own GradScaler loop makes none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["StepState"]


RING_SLOTS = 32
"""Overflow flags that may be on their way to the host at once. A host more steps ahead of the device than this
waits for the oldest (torch's CUDA launch queue holds it back well before that on any real model)."""


@dataclasses.dataclass(slots=True)
class StepState:
    """The engine's step counters and the outcome of its last optimizer step.

    >>> state = StepState(micro=5, epoch_len=8, steps=2, found_host=True)
    >>> state.to_dict()
    {'micro': 5, 'epoch_len': 8, 'steps': 2}
    >>> StepState.from_dict(state.to_dict())  # the outcome is not part of a checkpoint
    StepState(micro=5, epoch_len=8, steps=2, found_host=None, norm=None, deferred=None, diagnose_late=False, skipped=0)
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
    deferred: list[tuple[torch.Tensor, Any, int]] | None = None
    """The overflow flags of the last steps still on their way to the host, oldest first: (host copy, event or
    None, the step's number); None when none is."""
    diagnose_late: bool = False
    """An overflow learnt after its step: the next step diagnoses a scale collapse on its gradients."""
    skipped: int = 0
    """Optimizer steps known to have been skipped (the flags still in ``deferred`` are not counted yet)."""
    skipped_unreported: list[int] = dataclasses.field(default_factory=list, repr=False)
    """The numbers (``steps`` as counted then) of skipped steps learnt on the host and not yet reported: the optimizer
    step takes them (:meth:`take_skipped`) to warn or raise, at once or, for a flag read late, at the next step."""
    backwards: int = dataclasses.field(default=0, repr=False, compare=False)
    """``engine.backward()`` calls whose gradients no optimizer step has taken yet; a load counts the pending
    window's micro-batches (their gradients came from such calls). Not saved."""
    resumed: bool = dataclasses.field(default=False, repr=False, compare=False)
    """The counters came from a checkpoint and no micro-batch has ended since: the next :meth:`start_epoch`
    continues the epoch they stopped in. Not saved."""
    _ring: list[tuple[torch.Tensor, Any]] | None = dataclasses.field(default=None, repr=False, compare=False)
    _next: int = dataclasses.field(default=0, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The counters under the keys a checkpoint stores them by."""
        return {"micro": self.micro, "epoch_len": self.epoch_len, "steps": self.steps}

    @classmethod
    def from_dict(cls, counters: dict[str, Any]) -> StepState:
        """A state holding ``counters`` (as :meth:`to_dict` wrote them) and no step outcome, as a load leaves it."""
        return cls(micro=counters["micro"], epoch_len=counters["epoch_len"], steps=counters["steps"])

    # ------------------------------------------------------------------------------------------ the window
    def end_micro_batch(self, boundary: bool) -> bool:
        """Count a micro-batch that ends (``boundary``: its window too); True when an optimizer step is due now.

        >>> state = StepState(micro=1, epoch_len=2, backwards=2)
        >>> state.end_micro_batch(boundary=True), state.to_dict(), state.backwards  # the declared epoch is over
        (True, {'micro': 0, 'epoch_len': None, 'steps': 1}, 0)
        """
        self.micro += 1
        self.resumed = False  # a micro-batch has ended since any load
        if not boundary:
            return False
        if self.epoch_len is not None and self.micro >= self.epoch_len:
            self.micro, self.epoch_len = 0, None
        self.steps += 1
        self.backwards = 0  # the step takes them: the optimizers' guard sees none pending while it runs
        return True

    def note_backward(self) -> None:
        """An ``engine.backward()`` added gradients that the next optimizer step takes."""
        self.backwards += 1

    def discard_window(self, accumulate: int) -> int:
        """Forget the micro-batches of the open window (their gradients were dropped); returns how many.

        >>> state = StepState(micro=5); state.discard_window(accumulate=4), state.micro
        (1, 4)
        """
        pending = self.pending(accumulate)
        self.micro -= pending
        return pending

    def restore(self, saved: StepState) -> None:
        """Become ``saved`` (a ``copy.copy`` taken before a load that failed), outcome included."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(saved, f.name))

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

    def load_counters(self, counters: dict[str, Any], skipped_steps: int, accumulate: int) -> None:
        """Take ``counters`` (as :meth:`to_dict` wrote them) and the skipped count; forget the last step's outcome.

        >>> state = StepState(); state.load_counters({"micro": 5, "epoch_len": 10, "steps": 1}, 0, accumulate=3)
        >>> state.pending(3), state.backwards, state.resumed
        (2, 2, True)
        """
        fresh = StepState.from_dict(counters)
        fresh.skipped = int(skipped_steps)
        for field in dataclasses.fields(self):
            if field.compare:  # the host slots stay: they hold nothing once the outcomes are forgotten
                setattr(self, field.name, getattr(fresh, field.name))
        self.backwards = self.pending(accumulate)  # the saved window's gradients, put back beside the counters
        self.resumed = True

    def start_epoch(self, num_micro_batches: int | None, accumulate: int) -> str | None:
        """Begin an epoch of ``num_micro_batches`` (None: undeclared); returns a warning to log, or None.

        Right after a load inside a declared epoch, the call that starts that epoch again (the resume recipe's loop)
        continues it: the counters stay as loaded, so the resumed windows and divisors are the uninterrupted run's.
        Otherwise the epoch begins at micro-batch 0, which must be a window boundary: pending gradients would join
        the new epoch's first window, divided by the old window's size, so they are refused with the fix.

        >>> state = StepState(micro=4, epoch_len=5)  # accumulate=2: cut at a boundary, nothing pending
        >>> state.start_epoch(5, accumulate=2)  # doctest: +ELLIPSIS
        'start_epoch(): the previous epoch was declared with 5 micro-batches but 4 ran ...'
        >>> state.to_dict()
        {'micro': 0, 'epoch_len': 5, 'steps': 0}
        """
        if num_micro_batches is not None and (isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int) or num_micro_batches < 1):
            raise ValueError(f"num_micro_batches must be a positive int (e.g. len(loader)), got {num_micro_batches!r}.")
        if self.resumed and self.epoch_len is not None and self.micro > 0:
            if num_micro_batches != self.epoch_len:
                raise ValueError(
                    f"start_epoch({num_micro_batches!r}) right after loading a checkpoint saved {self.micro} micro-batches into an "
                    f"epoch declared with {self.epoch_len}: the resumed epoch continues from there, so it must have the "
                    f"length it had, or its windows differ from the interrupted run's. Pass start_epoch({self.epoch_len}) "
                    "(the same loader and batch size), or resume from a checkpoint saved at an epoch's end."
                )
            self.resumed = False
            return None  # the loaded epoch goes on where it stopped
        pending = self.pending(accumulate)
        if pending:
            if self.epoch_len is None:
                fix = ("windows run across epochs while none is declared: call start_epoch(len(loader)) from the first "
                       "epoch on (before its first micro-batch), so that each epoch's last window ends with it.")
            else:
                fix = (f"the epoch declared with {self.epoch_len} micro-batches ended after {self.micro}, inside a window. "
                       f"Declare the micro-batches the loop runs (here start_epoch({self.micro})), so that its last window ends with it.")
            raise RuntimeError(f"start_epoch() called with {pending} micro-batch(es) of gradients pending, which would join the "
                               f"new epoch's first window: {fix}")
        warning = None
        if self.epoch_len is not None and self.micro > 0:
            warning = (f"start_epoch(): the previous epoch was declared with {self.epoch_len} micro-batches but {self.micro} ran "
                       "(it ended at a window boundary, so no gradient was lost); a checkpoint saved after it would resume "
                       f"that epoch instead of starting this one. Declare the micro-batches the loop runs (here start_epoch({self.micro})).")
        self.micro, self.epoch_len, self.resumed = 0, num_micro_batches, False
        return warning

    # ------------------------------------------------------------------------------------------ outcome
    def record_outcome(self, any_found: torch.Tensor | None, host_found: list[bool] | None) -> None:
        """Note a step's overflow flag: read already (``host_found``), or sent to the host to be read later.

        >>> state = StepState()
        >>> state.record_outcome(torch.ones(()), [True]); state.found_host, state.skipped
        (True, 1)
        >>> state.record_outcome(torch.zeros(()), None); state.found_host, state.poll(), state.found_host
        (None, [False], False)
        """
        if any_found is None:
            self.found_host = False
            return
        if host_found is not None:
            self.found_host = any(host_found)
            self.skipped += self.found_host
            if self.found_host:
                self.skipped_unreported.append(self.steps)
            return
        self.found_host = None
        self._send(any_found)

    def _send(self, any_found: torch.Tensor) -> None:
        # One copy into a pinned host slot behind an event: reading it later waits for nothing queued after this
        # step (unlike .item(), which drains the stream), and once the event has passed, for nothing at all.
        # Only CUDA gets the pinned slots and events: another device's non-blocking copy would leave nothing to
        # wait on before reading, so there the copy is a plain (synchronous) one.
        on_cuda = any_found.device.type == "cuda"
        if self._ring is None:
            host = torch.empty(RING_SLOTS, dtype=torch.float32, pin_memory=on_cuda)
            # Views and events made once: a slot is reused only after its flag was read.
            # torch.cuda.Event.__new__ has no annotations (torch 2.13): untyped to mypy.
            self._ring = [(slot, torch.cuda.Event() if on_cuda else None) for slot in host.unbind()]  # type: ignore[no-untyped-call]
        slot, event = self._ring[self._next]
        self._next = (self._next + 1) % RING_SLOTS
        slot.copy_(any_found, non_blocking=on_cuda)
        if event is not None:
            # On the stream of the flag's own device, which ran the copy: the current device may be another
            # GPU (a model on cuda:1 without torch.cuda.set_device), whose stream would not order after it.
            event.record(torch.cuda.current_stream(any_found.device))
        if self.deferred is None:
            self.deferred = []
        self.deferred.append((slot, event, self.steps))

    @property
    def ring_full(self) -> bool:
        """Whether every host slot holds a flag not yet read (the next step must wait for the oldest first)."""
        return self.deferred is not None and len(self.deferred) >= RING_SLOTS

    def poll(self, wait: int | None = None) -> list[bool]:
        """Read the deferred flags that have reached the host, oldest first, waiting for the oldest ``wait`` of them
        (default: all); return them (True: that step was skipped).

        Reading a flag whose copy has landed involves no device: waiting is the only sync, and ``wait=0`` makes
        none. A skipped step learnt this way is diagnosed for collapse at the start of the next optimizer step
        (the engine sets ``diagnose_late``): the scaler then holds the latest state, and the gradients at hand
        are the ones to name (a persistent overflow shows in them too), whereas right after a step they were zeroed.
        """
        out: list[bool] = []
        while self.deferred:
            slot, event, step = self.deferred[0]
            if event is not None and not event.query():
                if wait is not None and len(out) >= wait:
                    break
                event.synchronize()
            self.deferred.pop(0)
            # Host memory the copy has reached: read as a Python number (.item() would dispatch an op for it).
            out.append(bool(slot.tolist()))
            if out[-1]:
                self.skipped_unreported.append(step)
        self.skipped += sum(out)
        if not self.deferred:
            self.deferred = None
            if out:
                self.found_host = out[-1]  # the last step's own flag: nothing newer is pending
        return out

    def take_skipped(self) -> list[int]:
        """The numbers of the skipped steps learnt since the last call, oldest first (each is returned once).

        >>> state = StepState(steps=3); state.record_outcome(torch.ones(()), [True]); state.take_skipped(), state.take_skipped()
        ([3], [])
        """
        taken, self.skipped_unreported = self.skipped_unreported, []
        return taken
