"""Save on preemption: a scheduler's stop signal ends the run with a checkpoint and the exit code that asks for a requeue.

    with engine.save_on_preemption("runs/last.pt", extra=lambda: {"epoch": epoch, "batch": i}):
        for epoch in ...:
            for i, (x, y) in enumerate(loader):
                ...                      # the usual loop: autocast, engine.backward(loss), engine.step()

Clusters stop a job with a signal and a grace period (SLURM ``--signal``, Kubernetes' ``terminationGracePeriodSeconds``,
torchrun's ``--shutdown-timeout``). Inside the context:

* The signal handler only notes the signal (nothing else is safe where a signal lands: inside an op, a save, a
  collective), then calls the handler that was installed before, if it is a Python function of the user's
  (a default action, terminating or raising KeyboardInterrupt, is what the context replaces).
* ``engine.step()`` checks the note at the end of every micro-batch (one attribute read: no sync, no collective in a
  single process). Once it is set, the step in flight finishes, :meth:`Engine.save` writes ``path`` atomically (the
  gradients of an unfinished accumulation window included, as ``save()`` always does), and :class:`Preempted`, a
  ``SystemExit``, ends the process with ``exit_code`` (:data:`REQUEUE_EXIT_CODE`: 75, ``EX_TEMPFAIL``, "temporary
  failure, run me again"). ``except Exception`` in the loop does not catch it; ``finally`` blocks run. Nothing
  trained is lost: the process stops right after the checkpoint that holds every micro-batch it trained.
* A signal after the loop's last step (during an evaluation inside the context) saves and exits when the context ends.
* Leaving the context puts back the handlers it replaced.

Under torchrun (world size > 1) the ranks must save the same micro-batch, though the signal may reach only some of
them (torchrun forwards its own SIGTERM to every worker; a scheduler that signals processes one by one may not). An
agreement starts an asynchronous all-reduce (MAX) of the rank's note on a gloo group of its own (on the host, so CUDA
runs are not synced), and the next agreement waits for it, by then long finished, and reads the ranks' common
answer: every rank reads the same answer at the same micro-batch, so all save it, and none waits for a rank that
stopped. Agreements come every micro-batch or, where micro-batches are short, about :data:`AGREE_EVERY_S` (50 ms)
apart: the all-reduce carries each rank's proposed interval too, and all take the largest, so they keep counting
the same checks (an all-reduce per micro-batch is a cost that a short CPU step shows). The cost is the
reaction: two agreements after the signal at most (about 0.1 s, two micro-batches at least) instead of one
micro-batch. Under FSDP a checkpoint cannot hold the pending gradients (they are unsharded per rank), so the checks
come at window ends only.

    >>> import signal, torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> engine = Engine(); model = nn.Linear(2, 1)
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> with engine.save_on_preemption("never-written.pt"):
    ...     signal.getsignal(signal.SIGTERM).__qualname__
    'PreemptionWatch._on_signal'
    >>> signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # put back
    True
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..distributed._agreement import world_size
from ..distributed._strategy import FSDP

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._engine_protocol import EngineLike

__all__ = ["REQUEUE_EXIT_CODE", "Preempted", "PreemptionWatch"]

log = logging.getLogger("ampkit")

REQUEUE_EXIT_CODE = 75
"""The exit code of a run that saved on preemption: ``EX_TEMPFAIL`` of sysexits.h, "a temporary failure; the user is
invited to retry". Schedulers have no common requeue code; this one is told apart from a crash (1), a kill (137) and
an unhandled SIGTERM (143) by whoever requeues: SLURM's ``RequeueExit=75`` or the batch script's ``scontrol requeue``,
a Kubernetes Job's ``podFailurePolicy`` (see docs/guides/preemption.md, "What your scheduler needs")."""

AGREE_EVERY_S = 0.05
"""Across ranks, how far apart (host time) the agreements come: each costs an all-reduce of two ints on a gloo group,
and a signal is acted on two agreements later at most (about 0.1 s, and at least two checks)."""
MAX_INTERVAL = 1000
"""Most checks between two agreements (micro-batches faster than 50 us)."""

Extra = dict[str, Any] | Callable[[], dict[str, Any] | None] | None


class Preempted(SystemExit):
    """Raised by ``engine.step()`` once the preemption checkpoint is written: exits the process with ``code``.

    A ``SystemExit``, so ``except Exception`` does not stop it and the interpreter exits with its code.

    >>> Preempted(75, "runs/last.pt", steps=12).code
    75
    """

    def __init__(self, code: int, path: str, steps: int) -> None:
        super().__init__(code)
        self.path = path
        """Where the checkpoint was written."""
        self.steps = steps
        """Optimizer steps the checkpoint holds."""


def _check_signals(signals: Sequence[Any]) -> tuple[signal.Signals, ...]:
    if isinstance(signals, (int, str)) or not isinstance(signals, (list, tuple)) or not signals:
        raise TypeError(f"signals= takes a tuple of signals, e.g. (signal.SIGTERM,) or (signal.SIGTERM, signal.SIGUSR1); got {signals!r}.")
    out = []
    for s in signals:
        try:
            sig = signal.Signals(s)
        except ValueError:
            raise ValueError(f"signals=: {s!r} is no signal of this platform; pass signal.SIGTERM (the default) or signal.SIGUSR1.") from None
        if sig in (getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)):
            raise ValueError(f"signals=: {sig.name} cannot be caught, so nothing can be saved on it; schedulers send SIGTERM (or the "
                             "signal you ask for, e.g. SLURM's --signal=USR1@120) before it: pass that one.")
        out.append(sig)
    return tuple(dict.fromkeys(out))


def _check_exit_code(code: Any) -> int:
    if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
        what = ("0 says the job is finished, so no scheduler would run it again and the run would stop where it was preempted"
                if code == 0 else f"got {code!r}")
        raise ValueError(f"exit_code= must be an int from 1 to 255 that your scheduler requeues on ({what}); "
                         f"the default is {REQUEUE_EXIT_CODE} (EX_TEMPFAIL).")
    return code


class PreemptionWatch:
    """What :meth:`Engine.save_on_preemption` returns: a context that installs the handlers and saves on the signal.

    The engine calls :meth:`check` at the end of each micro-batch while the context is active (see the module
    docstring for the protocol across ranks).
    """

    def __init__(self, engine: EngineLike, save: Callable[[Any, dict[str, Any] | None], None],
                 attach: Callable[[PreemptionWatch | None], None], path: str | os.PathLike[str], *, signals: Sequence[Any] = (signal.SIGTERM,), exit_code: int = REQUEUE_EXIT_CODE, extra: Extra = None) -> None:
        if extra is not None and not (callable(extra) or isinstance(extra, dict)):
            raise TypeError(f"extra= takes a dict or a function returning one (called at the save), got {type(extra).__name__}.")
        self.path = os.fspath(path)
        self.signals = _check_signals(signals)
        self.exit_code = _check_exit_code(exit_code)
        self._engine, self._save, self._attach, self._extra = engine, save, attach, extra
        self.received: int | None = None
        """The signal noted (its number), or None."""
        self._handler = self._on_signal  # one bound method: restoring checks that it is still the installed one
        self._previous: dict[signal.Signals, Any] = {}
        self._group: Any = None  # the ranks' gloo group for the agreement; None in a single process
        self._work: Any = None  # the all-reduce started at the last agreement's check
        self._answer: torch.Tensor | None = None
        self._interval = 1  # checks between agreements, as the ranks last agreed
        self._countdown = 1  # checks until the next agreement
        self._launched: float | None = None  # when the last agreement started (host clock)
        self._since = 0  # checks since then
        self._boundary_only = False
        self.active = False

    # ------------------------------------------------------------------------------------------ the handler
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a note: this runs wherever the main thread was (inside an op, a save, a collective).
        self.received = signum
        previous = self._previous.get(signal.Signals(signum))
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # the user's own handler, chained

    # ------------------------------------------------------------------------------------------ the context
    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("save_on_preemption() must be entered in the main thread: Python runs signal handlers there only.")
        if not self._engine.models:
            raise RuntimeError("save_on_preemption() is entered after engine.setup(model, optimizer): the save needs the model.")
        self._attach(self)  # refuses a second active context on the engine
        self.active = True
        try:
            self._boundary_only = isinstance(self._engine.strategy, FSDP)
            if world_size() > 1:
                # Its own gloo group: the agreement runs on the host, beside NCCL's or gloo's training collectives.
                self._group = dist.new_group(backend="gloo")
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                # A signal after the last check (the loop's end, an evaluation in the context): saved now.
                self._drain()
                if self._agree(blocking=True):
                    self._save_and_exit()
        finally:
            self._close()

    def _close(self) -> None:
        self.active = False
        self._attach(None)
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) is self._handler:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            else:
                log.warning("save_on_preemption(): the %s handler was replaced inside the context; it is left as it is.", sig.name)
        self._previous.clear()
        if self._group is not None:
            group, self._group, self._work = self._group, None, None
            dist.destroy_process_group(group)

    # ------------------------------------------------------------------------------------------ the check
    def check(self, boundary: bool) -> None:
        """At the end of a micro-batch (``boundary``: of its window too): save and exit if the ranks got the signal."""
        if self._boundary_only and not boundary:
            return
        if self._group is None:
            if self.received is not None:
                self._save_and_exit()
            return
        self._countdown -= 1
        self._since += 1
        if self._countdown > 0:
            return  # not an agreement's check: nothing but this count
        if self._drain():
            self._save_and_exit()
        self._agree(blocking=False)

    def _agree(self, blocking: bool) -> bool:
        """Start the all-reduce of this rank's note and its proposed interval (``blocking``: wait, return the answer)."""
        if self._group is None:
            return self.received is not None
        now = time.perf_counter()
        per_check = (now - self._launched) / self._since if self._launched is not None and self._since else 0.0
        self._launched, self._since = now, 0
        # Checks until the next agreement, so that agreements come about AGREE_EVERY_S apart: the ranks take the
        # largest proposal, and all read it from the same all-reduce, so they keep counting the same checks.
        proposal = min(MAX_INTERVAL, max(1, math.ceil(AGREE_EVERY_S / per_check))) if per_check > 0 else 1
        self._answer = torch.tensor([int(self.received is not None), proposal], dtype=torch.int64)
        self._work = dist.all_reduce(self._answer, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return self._drain() if blocking else False

    def _drain(self) -> bool:
        """Wait for the all-reduce in flight (started an interval ago: done by now); whether any rank got the signal.
        Sets the interval to the next agreement, the ranks' common answer."""
        if self._work is None:
            return False
        self._work.wait()
        self._work = None
        assert self._answer is not None
        noted, self._interval = self._answer.tolist()  # a host tensor: no device involved
        self._countdown = self._interval
        return bool(noted)

    def _save_and_exit(self) -> None:
        engine = self._engine
        extra = self._extra() if callable(self._extra) else self._extra
        how = f"{signal.Signals(self.received).name} received" if self.received is not None else "another rank received the signal"
        log.warning("preempted (%s): saving %s at step %d, %d micro-batch(es) into the window, then exiting with %d",
                     how, self.path, engine.steps, engine.micro_batches_pending, self.exit_code)
        self._save(self.path, extra)
        raise Preempted(self.exit_code, self.path, engine.steps)
