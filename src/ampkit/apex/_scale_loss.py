"""``amp.scale_loss``: the context whose ``as`` value is the scaled loss to call ``backward()`` on.

On entry, gradients already unscaled are set aside; on a clean exit the new gradients are unscaled on
torch's fused kernel, the set-aside ones added back, and the loss scale updated on the device. The decision
to skip is taken by the next ``optimizer.step()``, which reads the overflow flag once. The loss scalers are the
latest ``amp.initialize`` call's, for every optimizer: Apex kept one global list, which a second call replaced.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn

from ._session import AmpSession
from ._state import _amp_state

__all__ = ["scale_loss"]

_WITH_FORM = "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n        scaled_loss.backward()"


class ScaleLoss:
    """The context manager :func:`scale_loss` returns."""

    def __init__(self, session: AmpSession | None, loss: torch.Tensor, optimizers: list[Any], loss_id: int, delay_unscale: bool) -> None:
        self.session, self.loss, self.optimizers = session, loss, optimizers
        self.loss_id, self.delay_unscale = loss_id, delay_unscale
        self.passthrough = True

    def __enter__(self) -> torch.Tensor:
        s = self.session
        # Decided on entry, as Apex did, from the scale as it is now (a script may have assigned _loss_scale).
        self.passthrough = s is None or s.passes_through(s.views[self.loss_id])
        if self.passthrough:
            return self.loss.float() if s is not None else self.loss
        s.prepare_backward(self.optimizers)
        # fp32 before scaling: a 16-bit loss times 2^16 would overflow on its own.
        return s.views[self.loss_id].scaler.scale(self.loss.float())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        s = self.session
        if s is None or self.passthrough:  # s is tested too only for the type checker
            return
        if exc_type is not None:
            s.abandon_backward(self.optimizers)  # leave the gradients as they were before scale_loss
            return
        if self.delay_unscale:
            for opt in self.optimizers:
                opt._amp_stash.has_scaled_grads = True
            return
        s.unscale_after_backward(self.optimizers, self.loss_id)
        return

    def backward(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"amp.scale_loss(...) is a context manager, not the scaled loss. Use:\n{_WITH_FORM}")


def scale_loss(
    loss: Any,
    optimizers: Any = None,
    loss_id: int = 0,
    model: Any = None,
    delay_unscale: bool = False,
    delay_overflow_check: bool = False,
) -> ScaleLoss:
    """Scale ``loss`` for backward, then unscale the gradients of ``optimizers`` and update the loss scale.

    ``model`` and ``delay_overflow_check`` are accepted for Apex compatibility and unused (Apex did not use
    them either). With ``delay_unscale=True`` gradients stay scaled for a later scale_loss call to unscale.

    >>> from ampkit.apex import amp
    >>> model = nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    >>> with amp.scale_loss(model(torch.ones(3, 2)).sum(), opt) as scaled_loss:
    ...     scaled_loss.backward()
    >>> opt.step()
    """
    if isinstance(loss, nn.Module):
        raise TypeError(f"amp.scale_loss() takes the loss tensor, not a model, and is used as a context manager:\n{_WITH_FORM}")
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"amp.scale_loss() takes the loss tensor first, got {type(loss).__name__}. Use:\n{_WITH_FORM}")
    if optimizers is None:
        raise TypeError(f"amp.scale_loss() needs the optimizer(s) whose gradients it unscales:\n{_WITH_FORM}")
    opts = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
    session = _amp_state.session
    if session is None:
        if _amp_state.disabled:  # initialize(enabled=False): every amp call is a no-op
            return ScaleLoss(None, loss, opts, loss_id, delay_unscale)
        raise RuntimeError(
            "amp.scale_loss() was called before amp.initialize(). Call "
            "model, optimizer = amp.initialize(model, optimizer, opt_level=...) first."
        )
    if isinstance(loss_id, bool) or not isinstance(loss_id, int) or not 0 <= loss_id < len(session.views):
        raise ValueError(f"loss_id={loss_id!r} but amp.initialize(num_losses={len(session.views)}); pass num_losses={max(2, int(loss_id) + 1) if isinstance(loss_id, int) else 2} to initialize.")
    for opt in opts:
        stash = getattr(opt, "_amp_stash", None)
        if stash is None:
            raise RuntimeError(f"This {type(opt).__name__} was not passed through amp.initialize; pass the optimizer that initialize returned.")
    # An optimizer of an earlier initialize call is fine: as in Apex, it is scaled by the latest call's scalers.
    return ScaleLoss(session, loss, opts, loss_id, delay_unscale)
