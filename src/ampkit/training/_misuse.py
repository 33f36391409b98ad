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
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike

__all__ = ["DirectStepGuard", "check_window_backward", "direct_step_differs"]

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
        if why:
            raise RuntimeError(
                f"optimizer.step() called after engine.backward(loss), outside engine.step(): the gradients are {'; '.join(why)}. "
                "Write `engine.step()` in place of `optimizer.step()`; it steps at the window's end, with the schedulers, "
                "and zeroes the gradients (drop optimizer.zero_grad())."
            )


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
    elif engine.skip_nonfinite:
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
