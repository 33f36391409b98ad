"""Apex's amp handle: what ``amp.init()`` returns, and ``amp._amp_state.handle`` after an O1 ``initialize``.

``amp.init()`` turned O1's casts on for the whole process by patching torch. Here it sets torch's own
autocast state for each device (``torch.set_autocast_enabled``) and pushes an :class:`O1Functions` mode,
both undone by ``handle._deactivate()``. Both are torch's thread-local state: the casts apply to the thread
that called ``init()`` (the training loop), not to threads it starts itself.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator
from typing import Any

import torch

from .._compat import current_function_modes
from ..scaling import DynamicLossScaler, LossScaler, ScalerConfig, StaticLossScaler
from ..scaling._kernels import grads_of
from ._casts import disable_casts
from ._o1_functions import O1Functions
from ._properties import resolve_half_dtype

__all__ = ["AmpHandle", "NoOpHandle"]

log = logging.getLogger("ampkit")


class NoOpHandle:
    """What ``amp.init(enabled=False)`` returns: every method does nothing, ``scale_loss`` yields the loss."""

    def is_active(self) -> bool:
        return False

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizer: Any) -> Iterator[torch.Tensor]:
        yield loss

    @property
    def has_cache(self) -> bool:
        return False

    @property
    def verbose(self) -> bool:
        return False

    def _clear_cache(self) -> None:
        pass

    def _deactivate(self) -> None:
        pass


class AmpHandle(NoOpHandle):
    """An active amp handle; process-wide once :meth:`_activate` has run (``amp.init``), else model-scoped.

    >>> h = AmpHandle(); h.is_active()
    True
    >>> h._deactivate(); h.is_active()
    False
    """

    def __init__(self, loss_scale: float | str = "dynamic", enable_caching: bool = True, verbose: bool = False) -> None:
        if loss_scale != "dynamic" and not (isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool) and loss_scale > 0):
            raise ValueError(f"loss_scale must be 'dynamic' or a positive number, got {loss_scale!r}.")
        self._loss_scale = loss_scale
        self._enable_caching = enable_caching
        self._verbose = verbose
        self._is_active = True
        self._scaler: LossScaler | None = None
        self._mode: O1Functions | None = None
        self._saved: list[tuple[str, bool, torch.dtype]] = []
        self._saved_cache = True

    def is_active(self) -> bool:
        return self._is_active

    @property
    def has_cache(self) -> bool:
        return self._enable_caching

    @property
    def verbose(self) -> bool:
        return self._verbose

    def _activate(self, half_dtype: Any, allow_banned: bool) -> None:
        """Turn O1's casts on for this thread: autocast on every device type present, plus the lists' mode."""
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        dtypes = {d: resolve_half_dtype(d, half_dtype) for d in devices}  # checked before anything changes
        self._saved_cache = torch.is_autocast_cache_enabled()
        for d in devices:
            self._saved.append((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)))
            torch.set_autocast_dtype(d, dtypes[d])
            torch.set_autocast_enabled(d, True)
        # torch empties its cast cache only on leaving an autocast region, which process-wide casts never do:
        # a cached 16-bit weight would outlive optimizer.step(). So the cache is off outside regions; a
        # `with torch.autocast(...)` (such as an O1 model's forward) still turns it on for its own duration.
        torch.set_autocast_cache_enabled(False)
        self._mode = O1Functions(allow_banned=allow_banned)
        self._mode.__enter__()
        log.debug("amp.init: O1 casts on for %s", ", ".join(f"{d} ({t})" for d, t in dtypes.items()))

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        was, self._is_active = self._is_active, False
        try:
            with disable_casts():
                yield
        finally:
            self._is_active = was

    def _clear_cache(self) -> None:
        torch.clear_autocast_cache()

    def _deactivate(self) -> None:
        """Undo :meth:`_activate` (if it ran) and stop the casts of models initialized with this handle."""
        if self._mode is not None:
            stack = current_function_modes()
            if not stack or stack[-1] is not self._mode:
                raise RuntimeError(
                    "amp handle._deactivate(): a TorchFunctionMode entered after amp.init() is still active. "
                    "Exit it first (handles are undone in the reverse order of amp.init() calls)."
                )
            self._mode.__exit__(None, None, None)
            self._mode = None
            for d, enabled, dtype in reversed(self._saved):
                torch.set_autocast_enabled(d, enabled)
                torch.set_autocast_dtype(d, dtype)
            self._saved = []
            torch.set_autocast_cache_enabled(self._saved_cache)
        self._is_active = False

    # ------------------------------------------------------------------------------------------ loss scaling
    def _scaler_on(self, device: torch.device) -> LossScaler:
        if self._scaler is None:
            if self._loss_scale == "dynamic":
                # Apex's old LossScaler: 2^16 to start, x2 after 2000 clean steps, /2 on overflow.
                self._scaler = DynamicLossScaler(ScalerConfig(init_scale=2.0**16, growth_interval=2000, on_collapse="warn"), device)
            else:
                self._scaler = StaticLossScaler(float(self._loss_scale), device)
        return self._scaler

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizer: Any) -> Iterator[torch.Tensor]:
        """Apex's pre-2019 loss scaling: yield the scaled loss; on exit unscale ``optimizer``'s gradients.

        After an overflow the next ``optimizer.step()`` is skipped (once) and the scale backs off. Reads the
        overflow flag on exit: one host-device sync per call, as Apex's did.

        >>> h = AmpHandle(); w = torch.nn.Parameter(torch.ones(2)); opt = torch.optim.SGD([w], lr=1.0)
        >>> with h.scale_loss((w * 3).sum(), opt) as scaled:
        ...     scaled.backward()
        >>> w.grad
        tensor([3., 3.])
        """
        if not self.is_active():
            yield loss
            return
        scaler = self._scaler_on(loss.device)
        # fp32 before scaling: a 16-bit loss times 2^16 would overflow on its own.
        yield scaler.scale(loss.float())
        found = torch.zeros((), dtype=torch.float32, device=scaler.device)
        scaler.unscale_(grads_of(p for g in optimizer.param_groups for p in g["params"]), found)
        scaler.update(found)
        if found.item():
            _skip_next_step(optimizer, scaler.get_scale())
        self._clear_cache()


def _skip_next_step(optimizer: Any, scale: float) -> None:
    """Make ``optimizer.step()`` a no-op once, then restore the step it had (instance-level or the class's)."""
    own = optimizer.__dict__.get("step")

    def skip_step(self: Any, closure: Any = None) -> None:
        log.warning("Gradient overflow, skipping update; loss scale reduced to %s", scale)
        if own is None:
            del self.step
        else:
            self.step = own

    optimizer.step = types.MethodType(skip_step, optimizer)
