"""Configuration of the dynamic loss scaler."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

__all__ = ["ScalerConfig"]

_FP32_TINY = 2.0**-126


@dataclass(frozen=True, kw_only=True)
class ScalerConfig:
    """Dynamic loss-scaling rules. The defaults match ``torch.amp.GradScaler`` except for the floor and ceiling.

    >>> ScalerConfig(hysteresis=2, min_scale=1.0).growth_interval
    2000
    """

    init_scale: float = 2.0**16
    """Starting scale (torch and Apex: 2^16)."""
    growth_factor: float = 2.0
    """Multiplier after ``growth_interval`` clean steps in a row."""
    backoff_factor: float = 0.5
    """Multiplier when an overflow backs the scale off."""
    growth_interval: int = 2000
    """Clean steps in a row before the scale grows."""
    hysteresis: int = 1
    """Overflows tolerated before backing off (DeepSpeed uses 2). The budget refills when the scale grows, or
    after every clean step if ``consecutive_hysteresis``; once spent, each further overflow backs off."""
    consecutive_hysteresis: bool = False
    """Refill the hysteresis budget after every clean step (only overflows in a row count)."""
    min_scale: float = 1.0
    """Floor: the scale never goes below it. An overflow at the floor means scaling cannot help (collapse)."""
    max_scale: float = 2.0**24
    """Ceiling (Apex: 2^24). Larger scales buy no range and risk overflow in the backward pass."""
    max_consecutive_skips: int = 50
    """This many skipped steps in a row is a collapse even above the floor."""
    on_collapse: Literal["raise", "warn"] = "raise"
    """On collapse: raise LossScaleCollapseError (default, the run is wasting compute) or log a warning."""

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"ScalerConfig: {msg}")

        # Types first: the range checks below would otherwise fail with Python's own errors ("must be real number").
        for name in ("init_scale", "growth_factor", "backoff_factor", "min_scale", "max_scale"):
            value = getattr(self, name)
            need(isinstance(value, numbers.Real) and not isinstance(value, bool), f"{name} must be a number, got {type(value).__name__} {value!r}.")
        for name in ("growth_interval", "hysteresis", "max_consecutive_skips"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an int, got {type(value).__name__} {value!r}.")
        need(isinstance(self.consecutive_hysteresis, bool), f"consecutive_hysteresis must be True or False, got {self.consecutive_hysteresis!r}.")
        need(math.isfinite(self.init_scale) and self.init_scale > 0, f"init_scale must be a positive finite number, got {self.init_scale}.")
        need(self.growth_factor > 1.0, f"growth_factor must be > 1 (it grows the scale), got {self.growth_factor}.")
        need(0.0 < self.backoff_factor < 1.0, f"backoff_factor must be in (0, 1), got {self.backoff_factor}.")
        need(isinstance(self.growth_interval, int) and self.growth_interval >= 1, f"growth_interval must be an int >= 1, got {self.growth_interval!r}.")
        need(isinstance(self.hysteresis, int) and self.hysteresis >= 1, f"hysteresis must be an int >= 1 (1 = back off on every overflow), got {self.hysteresis!r}.")
        # The scale is an fp32 tensor: a floor below fp32's smallest normal number would round to 0 (or lose
        # its precision) there, and a zero scale multiplies every loss by 0.
        need(
            self.min_scale >= _FP32_TINY,
            f"min_scale must be at least {_FP32_TINY:.3g} (fp32's smallest normal number; the scale is stored in fp32), got {self.min_scale}.",
        )
        need(math.isfinite(self.max_scale) and self.max_scale <= 3.0e38, f"max_scale must be finite and fit in fp32, got {self.max_scale}.")
        need(self.min_scale <= self.init_scale <= self.max_scale, f"need min_scale <= init_scale <= max_scale, got {self.min_scale} <= {self.init_scale} <= {self.max_scale}; adjust one of them.")
        need(isinstance(self.max_consecutive_skips, int) and self.max_consecutive_skips >= 1, f"max_consecutive_skips must be an int >= 1, got {self.max_consecutive_skips!r}.")
        need(self.on_collapse in ("raise", "warn"), f"on_collapse must be 'raise' or 'warn', got {self.on_collapse!r}.")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for checkpoints and results files)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalerConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"ScalerConfig: unknown fields {sorted(unknown)}; valid: {sorted(known)}.")
        return cls(**data)
