"""A loss scaler with a fixed scale (Apex's static ``loss_scale=128.0``; O3's 1.0)."""

from __future__ import annotations

from typing import Any

import torch

from ._base import LossScaler

__all__ = ["StaticLossScaler"]


class StaticLossScaler(LossScaler):
    """Scale the loss by a constant. Overflowing steps are still detected (and skipped by the engine).

    >>> s = StaticLossScaler(128.0)
    >>> s.update(torch.ones(())); s.get_scale()
    128.0
    """

    def __init__(self, scale: float = 1.0, device: torch.device | str = "cpu") -> None:
        if not scale > 0 or scale == float("inf"):
            raise ValueError(f"StaticLossScaler: scale must be a positive finite number, got {scale}.")
        super().__init__(scale, device)

    def update(self, found_inf: torch.Tensor) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "static", "scale": self.get_scale()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "static":
            raise ValueError(f"StaticLossScaler cannot load state of a {state.get('kind')!r} scaler.")
        self._scale.fill_(float(state["scale"]))
