"""Loops that bypass :class:`~ampkit.training.Engine` where that trains wrong in silence: refused, naming the line to write.

Two calls carry the engine's loop, ``engine.backward(loss)`` and ``engine.step()``; what each does to the gradients
the other relies on:

* ``optimizer.step()`` of one's own after ``engine.backward(loss)`` steps gradients that are still multiplied by
  the loss scale (16-mixed: NaN weights), divided over a window that has not ended, or on the 16-bit model while
  the optimizer holds fp32 masters (nothing moves); it skips clipping, the overflow check and the adopted
  schedulers. :class:`DirectStepGuard`, a step pre-hook on each optimizer setup() adopts, refuses it before the
  optimizer changes anything, unless the engine has none of these to do (:func:`direct_step_differs`). It reads
  one counter per step (the ``engine.backward()`` calls no step has taken yet, which the engine zeroes before its
  own step reaches the optimizer): no sync, no per-tensor work. The engine's compiled steps call the update
  without hooks; the guard is marked so that those steps stay on (:func:`ampkit._compat.optimizer_has_step_hooks`
  leaves it out).
* ``engine.step()`` ending a window in which ``engine.backward()`` was never called: after a ``loss.backward()``
  of one's own the gradients were not multiplied by the loss scale that the step divides them by, nor divided by
  the window's size; with no backward at all the optimizer updates nothing while the LR schedulers and
  ``engine.steps`` move on. :func:`check_window_backward` refuses both, and lets pass the one case where a
  ``loss.backward()`` gives the gradients ``engine.backward()`` would: no loss scale and a window of one micro-batch.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Linear(2, 1); engine = Engine(accumulate=2)
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> engine.backward(model(torch.ones(1, 2)).sum())
    >>> opt.step()
    Traceback (most recent call last):
    ...
    RuntimeError: optimizer.step() called after engine.backward(loss), outside engine.step(): the gradients are each divided by 2 (the accumulation window's micro-batches) while the window is still open. Write `engine.step()` in place of `optimizer.step()`; it steps at the window's end, with the schedulers, and zeroes the gradients (drop optimizer.zero_grad()).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike
    from ._step_state import StepState

__all__ = ["DirectStepGuard", "ForeignStepGuard", "check_window_backward", "direct_step_differs", "guard_optimizers"]

_WRITE_BACKWARD = (
    "Write `engine.backward(loss)` in place of `loss.backward()`, once per micro-batch before engine.step() (to skip "
    "a batch, skip both calls; to update several optimizers from one backward, step them in one call: "
    "engine.step(opt_a, opt_b))."
)


class DirectStepGuard:
    """Step pre-hook: refuses ``optimizer.step()`` called outside ``engine.step()`` while gradients from
    ``engine.backward()`` are pending and stepping them directly would train otherwise than ``engine.step()``
    (see the module docstring). Holds the engine weakly, so that an optimizer kept after the run keeps no engine."""

    # The engine's compiled steps call the update without hooks, and they are the engine's own steps: this hook
    # need not run there, so it must not turn them off as a user's hook does (see optimizer_has_step_hooks).
    ampkit_bypassable = True

    def __init__(self, engine: EngineLike) -> None:
        self._engine = weakref.ref(engine)

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        engine = self._engine()
        if engine is None or not engine.step_state.backwards:
            return  # the engine's own step (it zeroed the count first), or no gradient of its making is pending
        why = direct_step_differs(engine, optimizer)
        if not why:
            # torch's plain loop on the engine's gradients: this step takes them, and the window watch starts afresh.
            watch = getattr(engine, "_watch", None)
            if watch is not None:
                watch.forget()
            return
        if why:
            raise RuntimeError(
                f"optimizer.step() called after engine.backward(loss), outside engine.step(): the gradients are {'; '.join(why)}. "
                "Write `engine.step()` in place of `optimizer.step()`; it steps at the window's end, with the schedulers, "
                "and zeroes the gradients (drop optimizer.zero_grad())."
            )


class ForeignStepGuard:
    """Global step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``): refuses the step of an
    optimizer setup() was *not* given that holds an engine's parameters (the model's, or the masters'), while gradients
    from ``engine.backward()`` are pending and stepping them directly trains otherwise than ``engine.step()``: under
    ``16-mixed`` it steps gradients still multiplied by the loss scale; under master weights it moves the 16-bit model
    while the masters stay, so the next ``engine.step()`` copies them back over the update and a checkpoint keeps
    the old weights.

    One for the process (:func:`guard_optimizers` registers it once), watching every engine set up, weakly: removing
    a hook per engine as engines are collected would mutate torch's hook dict while a step may be iterating it. Per
    optimizer step anywhere it reads one counter per live engine (nothing pending: done); whether an optimizer holds
    an engine's parameters is found once (a scan of its parameter ids) and cached weakly.
    """

    ampkit_bypassable = True  # as DirectStepGuard: the engine's own compiled steps need not run it

    def __init__(self) -> None:
        # Each engine weakly, beside its step state (a plain object read first: the common case costs one attribute).
        self._watched: list[tuple[weakref.ref[EngineLike], StepState]] = []
        self._holds: weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[int, bool]] = weakref.WeakKeyDictionary()

    def watch(self, engine: EngineLike) -> None:
        self._watched = [(ref, state) for ref, state in self._watched if ref() is not None]  # a new list: a step may iterate the old
        self._watched.append((weakref.ref(engine), engine.step_state))

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for ref, state in self._watched:
            if state.backwards:
                engine = ref()
                if engine is not None and not any(o is optimizer for o in engine.optimizers):
                    self._check(engine, optimizer)  # gradients of the engine's pending, and not one of its own optimizers

    def _check(self, engine: EngineLike, optimizer: torch.optim.Optimizer) -> None:
        known = self._holds.setdefault(optimizer, {})
        holds = known.get(id(engine))
        if holds is None:
            ours = {id(p) for _, p in engine.named_parameters()}
            if engine.masters is not None:
                ours.update(id(m) for m in engine.masters.masters)
            holds = known[id(engine)] = any(id(p) in ours for g in optimizer.param_groups for p in g["params"])
        if not holds:
            return  # another model's optimizer: none of this engine's business
        why = [w for w in direct_step_differs(engine, optimizer) if "masters" not in w]
        if engine.masters is not None:
            why.append("on the 16-bit model, whose fp32 masters this optimizer does not move: engine.step() copies the masters "
                       "back over its update, and a checkpoint keeps the old weights")
        if why:
            raise RuntimeError(
                f"{type(optimizer).__name__}.step() of an optimizer engine.setup() was not given, on the model's parameters after "
                f"engine.backward(loss): the gradients are {'; '.join(why)}. Pass every optimizer to engine.setup(model, opt_a, "
                "opt_b) (or engine.setup_optimizers) and step them with engine.step()."
            )


_FOREIGN: list[ForeignStepGuard] = []  # the process's one guard, once registered


def guard_optimizers(engine: EngineLike, opts: Sequence[torch.optim.Optimizer], *, foreign: bool) -> None:
    """Register :class:`DirectStepGuard` on each of ``opts`` (the optimizers setup() adopted) and, where ``foreign``
    (once per engine), have the process's :class:`ForeignStepGuard` watch ``engine``."""
    guard = DirectStepGuard(engine)
    for opt in opts:
        opt.register_step_pre_hook(guard)
    if foreign:
        if not _FOREIGN:
            _FOREIGN.append(ForeignStepGuard())
            register_optimizer_step_pre_hook(_FOREIGN[0])
        _FOREIGN[0].watch(engine)


def direct_step_differs(engine: EngineLike, optimizer: torch.optim.Optimizer) -> list[str]:
    """What ``engine.step()`` would do to the pending gradients that ``optimizer.step()`` alone does not, in words;
    empty where the two steps are the same (no scale, no masters, one micro-batch per step, nothing to clip, check
    or schedule).

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Linear(2, 1); engine = Engine("32-true", clip_grad_norm=1.0)
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> direct_step_differs(engine, opt)
    ['not yet clipped to a total norm of 1.0']
    """
    why = []
    if engine.scaler is not None:
        why.append("still multiplied by the loss scale (engine.step() divides them by it, and skips a step that overflowed)")
    elif engine.skip_nonfinite and getattr(getattr(engine.optimizer_step, "settings", None), "skip_asked", True):
        # Asked for, not the default check of an unscaled policy: torch's plain loop goes without that one.
        why.append("not yet checked for inf/NaN (engine.step() skips such a step)")
    if engine.masters is not None:
        why.append("on the 16-bit model, not on the fp32 masters the optimizer steps (engine.step() copies them there)")
    if engine.accumulate > 1:
        why.append(f"each divided by {engine.accumulate} (the accumulation window's micro-batches) while the window is still open")
    if engine.clip_grad_norm is not None:
        why.append(f"not yet clipped to a total norm of {engine.clip_grad_norm}")
    elif engine.clip_grad_value is not None:
        why.append(f"not yet clamped to {engine.clip_grad_value}")
    if any(s.optimizer is optimizer for s in engine.schedulers):
        why.append("not followed by the LR scheduler setup() adopted, which steps only in engine.step()")
    return why


def check_window_backward(engine: EngineLike, window: int) -> None:
    """Refuse to end a window of ``window`` micro-batches in which ``engine.backward()`` was never called, where its
    optimizer step would train wrong (see the module docstring). Called by ``engine.step()`` only then: a loop that
    calls ``engine.backward()`` pays nothing here."""
    if engine.scaler is not None:
        raise RuntimeError(
            f"engine.step() ended an optimizer step with no engine.backward() since the last one, under {engine.policy.name} "
            "with loss scaling: engine.step() divides the gradients by the loss scale, which only engine.backward(loss) "
            "multiplies the loss by; after a loss.backward() of your own they would be that many times too small, and "
            f"with no backward at all the optimizer would update nothing while the LR schedulers move on. {_WRITE_BACKWARD}"
        )
    if window > 1:
        raise RuntimeError(
            f"engine.step() ended an accumulation window of {window} micro-batches with no engine.backward() in it: "
            "engine.backward(loss) divides each micro-batch's loss by the window's size, so the step takes their mean; "
            f"after loss.backward() calls of your own it would take their sum, {window} times the gradient. {_WRITE_BACKWARD}"
        )
    # One micro-batch and no scale: a loss.backward() of the user's own left the very gradients engine.backward()
    # gives. Only none at all is wrong. The scan stops at the first gradient found.
    if not any(p.grad is not None for _, p in engine.named_parameters()):
        raise RuntimeError(
            "engine.step() with no engine.backward() since the last optimizer step and no gradient on any parameter: "
            f"the optimizer would update nothing while the LR schedulers and engine.steps move on. {_WRITE_BACKWARD}"
        )
