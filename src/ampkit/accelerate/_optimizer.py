"""The optimizer an :class:`~ampkit.accelerate.AmpkitAccelerator` returns from ``prepare``: Accelerate's
``AcceleratedOptimizer`` whose ``step()`` is the engine's.

The user's loop keeps calling ``optimizer.step()``: at an accumulation boundary (``accelerator.sync_gradients``) it
is :meth:`ampkit.Engine.step` on this optimizer (unscale, check, step or skip, scaler update, master copy-back, zero
the gradients it took); inside a window it does nothing, as Accelerate's does. ``step_was_skipped`` is the engine's
answer for this optimizer's last step, so ``accelerator.optimizer_step_was_skipped`` and a scheduler prepared by
Accelerate (which steps only when no optimizer skipped) follow the engine. That answer is read when asked (one
host-device sync where the flag is still on its way, none on the CPU), or when another optimizer of the same
accelerator steps first, since the engine keeps one step's outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from accelerate.optimizer import AcceleratedOptimizer

if TYPE_CHECKING:
    from ..training import Engine

__all__ = ["AmpkitOptimizer", "StepLedger"]


class StepLedger:
    """What an accelerator's optimizers share between steps: which one stepped last (the engine holds that step's
    outcome only until the next), and which ones' gradients ``engine.unscale_`` took since their last step."""

    def __init__(self) -> None:
        self.last: AmpkitOptimizer | None = None
        self.unscaled: set[int] = set()  # ids of the engine's optimizers

    def before_step(self, optimizer: AmpkitOptimizer) -> None:
        if self.last is not None and self.last is not optimizer:
            self.last._settle()  # read its outcome before the engine's next step replaces it
        self.last = optimizer


class AmpkitOptimizer(AcceleratedOptimizer):
    """``AcceleratedOptimizer`` over ``optimizer`` (the one the engine adopted: masters swapped in, or its library
    twin) whose ``step()`` is ``engine.step(optimizer)`` at an accumulation boundary. Built by ``prepare``.

    >>> from torch import nn
    >>> from ampkit.accelerate import AmpkitAccelerator
    >>> accelerator = AmpkitAccelerator("16-mixed", cpu=True); model = nn.Linear(2, 1)
    >>> model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> accelerator.backward(model(torch.ones(1, 2)).sum()); opt.step()
    >>> type(opt).__name__, opt.step_was_skipped, accelerator.engine.scale  # 2**16 overflowed fp16: skipped, scale halved
    ('AmpkitOptimizer', True, 32768.0)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, engine: Engine, ledger: StepLedger | None = None, device_placement: bool = True) -> None:
        super().__init__(optimizer, device_placement=device_placement, scaler=None)
        self._engine = engine
        self._ledger = ledger if ledger is not None else StepLedger()  # the accelerator's, shared by its optimizers
        self._outcome_pending = False  # stepped, and the engine still holds the outcome

    def step(self, closure: Any = None) -> None:
        """At an accumulation boundary, the engine's step of this optimizer; inside a window, nothing."""
        if closure is not None:
            raise ValueError("optimizer.step(closure) under AmpkitAccelerator: the engine steps once per backward it scaled and cannot "
                             "re-evaluate a closure; call accelerator.backward(loss) yourself, then optimizer.step().")
        if not self.gradient_state.sync_gradients:
            return
        engine = self._engine
        if engine.scaler is not None and not engine.step_state.backwards and self._ledger.last is not None and self._ledger.last is not self:
            raise RuntimeError(
                "optimizer.step() of a second optimizer after the same accelerator.backward(loss), under a scaled loss: the first "
                "optimizer's step has updated the loss scale, so this one's gradients can no longer be unscaled by the scale they "
                "were made with. Put both optimizers' parameters in one optimizer (one param group each), or give each optimizer "
                "its own accelerator.backward() (a GAN's discriminator and generator losses)."
            )
        self._ledger.before_step(self)
        try:
            engine.step(self.optimizer)
        finally:
            self._ledger.unscaled.discard(id(self.optimizer))  # the step took (or, on error, dropped) what unscale_ made
        self._outcome_pending = True

    def _settle(self) -> None:
        """Read this optimizer's last outcome from the engine now (it may sync once)."""
        if self._outcome_pending:
            self._is_overflow = self._engine.step_was_skipped
            self._outcome_pending = False

    @property
    def step_was_skipped(self) -> bool:
        """Whether this optimizer's last step was skipped (non-finite gradients). May sync once."""
        self._settle()
        return bool(self._is_overflow)
