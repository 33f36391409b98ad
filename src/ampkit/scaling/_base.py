"""The base every ampkit loss scaler shares, so the engine treats dynamic and static scaling alike (the step needs\nonly :class:`~ampkit.scaling.StepScaler`'s members, which it implements)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

import torch

from ._kernels import unscale_grads_

__all__ = ["LossScaler"]


class LossScaler(ABC):
    """Scales the loss before backward and unscales gradients before the optimizer, on fused kernels.

    The scale lives in a 0-dim float32 tensor on the training device, so scaling and unscaling never sync
    with the host. Reading :meth:`get_scale` does.
    """

    def __init__(self, init_scale: float, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._scale = torch.full((), float(init_scale), dtype=torch.float32, device=self.device)
        self._one = torch.ones((), dtype=torch.float32, device=self.device)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # An unpickled scaler owns its state. torch.multiprocessing hands a CPU tensor to a spawned process as shared
        # memory: a scaler passed to spawned ranks (Lightning's ddp_spawn pickles its precision plugin) would otherwise
        # keep one scale for all of them, and each rank's update would back it off again (two ranks: a quarter).
        self.__dict__.update(state)
        self._own_state()

    def _own_state(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.clone())

    def to(self, device: torch.device | str) -> LossScaler:
        """Move the scaler's state tensors to ``device`` (the engine does this at setup)."""
        device = torch.device(device)
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        self.device = device
        return self

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """Return ``loss * scale`` (no sync).

        >>> from ampkit.scaling import StaticLossScaler
        >>> StaticLossScaler(128.0).scale(torch.tensor(0.5))
        tensor(64.)
        """
        return loss * self._scale.to(loss.device, non_blocking=True)

    @property
    def scale_tensor(self) -> torch.Tensor:
        """The current scale as a 0-dim float32 device tensor (what fused optimizers take as ``grad_scale``)."""
        return self._scale

    def inv_scale(self) -> torch.Tensor:
        # The reciprocal is taken in fp64 because fp32 division can be imprecise for scales that are not
        # powers of two; torch's GradScaler does the same.
        return self._scale.double().reciprocal().float()

    def unscale_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        """Divide ``grads`` by the scale in place and record any inf/NaN in ``found_inf`` (no sync)."""
        return unscale_grads_(grads, self.inv_scale(), found_inf)

    def check_(self, grads: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        """Record inf/NaN in ``grads`` into ``found_inf`` without unscaling (for fused optimizers)."""
        return unscale_grads_(grads, self._one, found_inf)

    def get_scale(self) -> float:
        """The current scale as a Python float. Syncs with the device."""
        return float(self._scale.item())

    @property
    def on_collapse(self) -> Literal["raise", "warn"]:
        """What the engine does when :meth:`collapse_reason` names a collapse (a scaler without one: raise)."""
        return "raise"

    @abstractmethod
    def update(self, found_inf: torch.Tensor) -> None:
        """Adjust the scale after a step; ``found_inf`` > 0 means the step's gradients were not finite."""

    def collapse_reason(self) -> str | None:
        """Why scaling has collapsed (the engine asks after a skipped step), or None. May sync."""
        return None

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume scaling exactly."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
