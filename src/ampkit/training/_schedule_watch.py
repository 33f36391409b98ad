"""LR schedulers that move other than the engine moves them: stepped twice per step, or on skipped steps.

``engine.setup(model, opt, schedulers=sched)`` hands the scheduler to the engine, which steps it after each real
(not skipped) optimizer step. Two loops go wrong in silence around that:

* the scheduler is given to setup **and** stepped by hand (``sched.step()`` after ``engine.step()``, as torch's
  plain loop does): it decays twice per step. :meth:`ScheduleWatch.check` refuses it at the next optimizer step,
  before anything changes: each adopted scheduler's ``last_epoch`` must be where the engine left it. One integer
  compare per scheduler per optimizer step; no sync.
* the scheduler is **not** given to setup, on an optimizer whose steps can be skipped (an overflow under 16-mixed,
  a non-finite loss under any policy): stepped by hand after every ``engine.step()``, it decays on steps that did
  not update the weights. It cannot be seen from the optimizer (torch's schedulers leave only a marker on
  ``optimizer.step``, the same whoever steps them, and a framework may wrap one to step on real steps only), so
  what is watched is its effect: after a skipped step the learning rates of the optimizers without an adopted
  scheduler are noted, and a change by the next optimizer step is warned about once, naming ``schedulers=``.
  Nothing is read on steps that were not skipped. A hand-written schedule that moves the learning rate after a
  skipped step on purpose is legitimate, hence a warning, not an error.

    >>> import torch
    >>> w = torch.nn.Parameter(torch.zeros(2)); opt = torch.optim.SGD([w], lr=1.0)
    >>> sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    >>> watch = ScheduleWatch(); watch.note([sched])
    >>> w.grad = torch.ones(2); opt.step(); sched.step()  # a hand step of an adopted scheduler
    >>> watch.check([sched])
    Traceback (most recent call last):
    ...
    RuntimeError: LR scheduler 0 (StepLR) was stepped outside engine.step(): its last_epoch is 1, where the engine left it at 0. engine.step() steps the schedulers given to setup(..., schedulers=...) after each real optimizer step, so a scheduler.step() of your own decays it twice per step. Drop your scheduler.step() call; or leave the scheduler out of setup() and step it yourself, only when `not engine.step_was_skipped`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ScheduleWatch"]

log = logging.getLogger("ampkit")


class ScheduleWatch:
    """Watches the adopted schedulers' positions and, after a skipped step, the other optimizers' learning rates."""

    def __init__(self) -> None:
        self._epochs: dict[int, int] = {}  # id(scheduler) -> the last_epoch the engine left it at
        self._lrs: list[tuple[torch.optim.Optimizer, list[float]]] | None = None  # noted after a skipped step
        self._warned = False

    def note(self, schedulers: Sequence[Any]) -> None:
        """Where the engine leaves ``schedulers`` (after its step, or after a load put their state back)."""
        self._epochs = {id(s): epoch for s in schedulers if isinstance(epoch := getattr(s, "last_epoch", None), int)}

    def check(self, schedulers: Sequence[Any]) -> None:
        """Refuse an adopted scheduler that moved since :meth:`note` (see the module docstring)."""
        for i, s in enumerate(schedulers):
            left = self._epochs.get(id(s))
            if left is None or getattr(s, "last_epoch", left) == left:
                continue
            raise RuntimeError(
                f"LR scheduler {i} ({type(s).__name__}) was stepped outside engine.step(): its last_epoch is {s.last_epoch}, "
                f"where the engine left it at {left}. engine.step() steps the schedulers given to setup(..., schedulers=...) "
                "after each real optimizer step, so a scheduler.step() of your own decays it twice per step. Drop your "
                "scheduler.step() call; or leave the scheduler out of setup() and step it yourself, only when "
                "`not engine.step_was_skipped`."
            )

    def after_skip(self, optimizers: Sequence[torch.optim.Optimizer], schedulers: Sequence[Any]) -> None:
        """A step was skipped: note the learning rates of the optimizers no adopted scheduler steps (once per run)."""
        if self._warned:
            return
        free = [o for o in optimizers if not any(s.optimizer is o for s in schedulers)]
        noted = [(o, lrs) for o in free if (lrs := _lrs(o)) is not None]
        self._lrs = noted or None

    def check_lrs(self, steps: int) -> None:
        """At the optimizer step after a skipped one: warn once if a noted learning rate moved since."""
        noted, self._lrs = self._lrs, None
        if noted is None:
            return
        moved = [(o, before, now) for o, before in noted if (now := _lrs(o)) is not None and now != before]
        if not moved:
            return
        self._warned = True
        opt, before, now = moved[0]
        log.warning(
            "The learning rate of %s moved from %s to %s between a skipped optimizer step and step %d, while the engine "
            "steps no LR scheduler of it: a scheduler stepped after every engine.step() decays on steps that did not "
            "update the weights. Pass it to engine.setup(model, optimizer, schedulers=scheduler), which steps it after real "
            "steps only (and drop your scheduler.step()), or step it only when `not engine.step_was_skipped`.",
            type(opt).__name__, _short(before), _short(now), steps,
        )


def _lrs(optimizer: torch.optim.Optimizer) -> list[float] | None:
    """The groups' learning rates as numbers; None where one is a tensor (reading it could sync)."""
    lrs = [g.get("lr") for g in optimizer.param_groups]
    numbers = [float(lr) for lr in lrs if isinstance(lr, (int, float))]
    return numbers if len(numbers) == len(lrs) else None


def _short(lrs: list[float]) -> str:
    return f"{lrs[0]:g}" if len(set(lrs)) == 1 else "[" + ", ".join(f"{lr:g}" for lr in lrs) + "]"
