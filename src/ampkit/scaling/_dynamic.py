"""Dynamic loss scaling with hysteresis, a floor, a ceiling and collapse detection, updated on the device."""

from __future__ import annotations

from typing import Any, Literal

import torch

from .._compat import amp_update_scale_
from ._base import LossScaler
from ._config import ScalerConfig

__all__ = ["DynamicLossScaler"]


class DynamicLossScaler(LossScaler):
    """torch's dynamic scaling rules plus hysteresis, a floor and a ceiling; the update never syncs.

    After ``growth_interval`` clean steps in a row the scale is multiplied by ``growth_factor`` (up to
    ``max_scale``); an overflow spends one unit of the hysteresis budget, and once the budget is spent the
    scale is multiplied by ``backoff_factor`` (down to ``min_scale``). With the defaults and no floor or
    ceiling reached, the scale sequence is exactly torch.amp.GradScaler's.

    >>> s = DynamicLossScaler(ScalerConfig(init_scale=8.0, growth_interval=2))
    >>> s.update(torch.zeros(())); s.update(torch.zeros(())); s.get_scale()
    16.0
    >>> s.update(torch.ones(())); s.get_scale()
    8.0
    """

    def __init__(self, config: ScalerConfig | None = None, device: torch.device | str = "cpu") -> None:
        self.config = config or ScalerConfig()
        super().__init__(self.config.init_scale, device)
        self._growth_tracker = torch.zeros((), dtype=torch.int32, device=self.device)
        self._hysteresis_left = torch.full((), self.config.hysteresis, dtype=torch.int32, device=self.device)
        # The skipped steps in a row, and 1 when the last update wanted to back off but the scale already sat at
        # the floor: two elements of one tensor, so that one multiply by the step's flag keeps or clears both.
        self._skip_flags = torch.zeros(2, dtype=torch.float32, device=self.device)
        self._bind_skip_flags()

    def _bind_skip_flags(self) -> None:
        self._consecutive_skips, self._blocked_at_floor = self._skip_flags.unbind()  # views, made once

    def _own_state(self) -> None:
        super()._own_state()
        self._bind_skip_flags()  # the views were cloned apart: bind them to the cloned tensor again

    def to(self, device: torch.device | str) -> DynamicLossScaler:
        super().to(device)
        self._bind_skip_flags()  # the views moved one by one are copies: bind them to the moved tensor again
        return self

    def update(self, found_inf: torch.Tensor) -> None:
        """Apply one step's outcome (``found_inf`` > 0: the step's gradients were not finite); no host-device sync.

        Without hysteresis six 0-dim device ops: torch's fused update kernel, as GradScaler's ``update``; the
        clamp to the floor and ceiling; and four that keep the collapse counters (skips in a row, an overflow at
        the floor). About 20 with hysteresis.
        """
        c = self.config
        found_f = found_inf.to(self.device, dtype=torch.float32, non_blocking=True)
        found = found_f > 0
        if c.hysteresis == 1:
            # Without hysteresis the rules are GradScaler's plus a clamp, so torch's own fused update kernel does
            # the work, and the counters take three in-place ops after the flag: each op dispatched is a launch,
            # which shows on steps of a millisecond or two (tests/unit/training/test_optimizer_step.py counts them).
            torch.le(self._scale, c.min_scale, out=self._blocked_at_floor)  # at the floor before this update
            self._consecutive_skips.add_(1)
            self._skip_flags.mul_(found)  # an overflow keeps both; a clean step clears both
            amp_update_scale_(self._scale, self._growth_tracker, found_f, c.growth_factor, c.backoff_factor, c.growth_interval)
            self._scale.clamp_(c.min_scale, c.max_scale)
            return
        self._consecutive_skips.copy_((self._consecutive_skips + 1) * found)
        budget = torch.where(found, self._hysteresis_left - 1, self._hysteresis_left)
        back_off = found & (budget <= 0)
        budget = budget.clamp(min=0)  # a spent budget stays spent: every further overflow backs off
        blocked = back_off & (self._scale <= c.min_scale)
        # Products are formed in fp64 and rounded to fp32 once, as torch's _amp_update_scale_ does (it multiplies
        # the fp32 scale by a double factor): rounding the factor to fp32 first would drift from GradScaler for
        # factors such as 0.3. The clamps then compare in fp32, where the floor and ceiling are stored.
        wide = self._scale.double()
        backed_off = (wide * c.backoff_factor).float().clamp(min=c.min_scale)
        grown = (wide * c.growth_factor).float().clamp(max=c.max_scale)
        scale = torch.where(back_off, backed_off, self._scale)
        tracker = torch.where(found, 0, self._growth_tracker + 1)
        grow = tracker >= c.growth_interval
        scale = torch.where(grow, grown, scale)
        tracker = torch.where(grow, 0, tracker)
        refill = (grow | ~found) if c.consecutive_hysteresis else grow
        budget = torch.where(refill, c.hysteresis, budget)
        # In-place copies keep the tensors' identity, so anything holding scale_tensor sees the new value.
        self._scale.copy_(scale)
        self._growth_tracker.copy_(tracker)
        self._hysteresis_left.copy_(budget)
        self._blocked_at_floor.copy_(blocked)

    def collapse_reason(self) -> str | None:
        """Why scaling has collapsed, or None. Syncs (the engine calls it only after a skipped step)."""
        c = self.config
        scale, skips, blocked = torch.stack(
            [self._scale, self._consecutive_skips.float(), self._blocked_at_floor.float()]
        ).tolist()
        if blocked:
            return f"gradients overflowed with the loss scale already at its floor min_scale={c.min_scale:g}"
        if skips >= c.max_consecutive_skips:
            return (
                f"{int(skips)} steps in a row were skipped for non-finite gradients"
                f" (max_consecutive_skips={c.max_consecutive_skips}); the loss scale is now {scale:g}"
            )
        return None

    @property
    def on_collapse(self) -> Literal["raise", "warn"]:
        """``config.on_collapse``: raise :class:`~ampkit.LossScaleCollapseError`, or warn once per episode."""
        return self.config.on_collapse

    @property
    def consecutive_skips(self) -> int:
        """Skipped steps in a row, as of the last update. Syncs."""
        return int(self._consecutive_skips.item())

    def state_dict(self) -> dict[str, Any]:
        """Scale, counters and config; reading them syncs once."""
        scale, tracker, budget, skips = torch.stack(
            [self._scale.double(), self._growth_tracker.double(), self._hysteresis_left.double(), self._consecutive_skips.double()]
        ).tolist()
        blocked = int(self._blocked_at_floor.item())
        return {
            "kind": "dynamic",
            "scale": scale,
            "growth_tracker": int(tracker),
            "hysteresis_left": int(budget),
            "consecutive_skips": int(skips),
            "blocked_at_floor": blocked,
            "config": self.config.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scale and counters. The constructor's config is kept: resume with the same config."""
        if state.get("kind") != "dynamic":
            raise ValueError(f"DynamicLossScaler cannot load state of a {state.get('kind')!r} scaler.")
        self._scale.fill_(float(state["scale"]))
        self._growth_tracker.fill_(int(state["growth_tracker"]))
        self._hysteresis_left.fill_(int(state["hysteresis_left"]))
        self._consecutive_skips.fill_(int(state["consecutive_skips"]))
        self._blocked_at_floor.fill_(int(state.get("blocked_at_floor", 0)))
