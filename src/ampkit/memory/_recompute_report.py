"""The :class:`RecomputeReport` that :func:`~ampkit.memory.recompute` returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .._util.units import fmt_bytes
from ._recompute_wrap import _is_recomputed, _unwrap

__all__ = ["RecomputeReport"]


@dataclass(frozen=True)
class RecomputeReport:
    """What :func:`recompute` checkpointed and the activations it measured before and after.

    Byte figures are None when no ``example_batch`` was given (nothing was measured).
    """

    modules: tuple[str, ...]
    """Names of the checkpointed submodules, in model order."""
    activations_before: int | None
    """Bytes held for backward between forward and backward without recomputation (batch and weights left out)."""
    activations_after: int | None
    """The same, measured with the chosen modules checkpointed."""
    peak_before: int | None
    """Most bytes live during forward and backward above the weights and batch (gradients included), before."""
    peak_after: int | None
    """The same with recomputation: backward rebuilds one block's activations at a time on top of what is held."""
    budget: int | None = None
    policy: str = "32-true"
    method: str | None = None
    """``fake`` (fake tensors, nothing allocated), ``real``, or None when nothing was measured."""
    savings: dict[str, int] = field(default_factory=dict)
    """``"auto"`` only: bytes each candidate block frees when checkpointed (from one attributed forward)."""
    _model: Any = field(default=None, repr=False, compare=False)

    @property
    def saved(self) -> int | None:
        """``activations_before - activations_after``."""
        if self.activations_before is None or self.activations_after is None:
            return None
        return self.activations_before - self.activations_after

    @property
    def ratio(self) -> float | None:
        """``activations_after / activations_before``."""
        if not self.activations_before or self.activations_after is None:
            return None
        return self.activations_after / self.activations_before

    @property
    def fits(self) -> bool | None:
        """Whether the measured activations are within ``budget`` (None without a budget or a measurement)."""
        if self.budget is None or self.activations_after is None:
            return None
        return self.activations_after <= self.budget

    def undo(self) -> list[str]:
        """Give the modules this call checkpointed their own forward back; returns their names."""
        model = self._model() if self._model is not None else None
        if model is None:
            return []
        undone = []
        for name in self.modules:
            m = model.get_submodule(name)
            if _is_recomputed(m):
                _unwrap(m)
                undone.append(name)
        return undone

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``saved`` and ``ratio`` included)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}
        return {**d, "modules": list(self.modules), "saved": self.saved, "ratio": self.ratio}

    def __str__(self) -> str:
        shown = ", ".join(self.modules[:6]) + (f", ... ({len(self.modules)} in all)" if len(self.modules) > 6 else "")
        lines = [f"recompute: {len(self.modules)} module(s) checkpointed: {shown or 'none'}"]
        if self.activations_before is None:
            lines.append("  not measured: pass example_batch=(inputs, targets) to measure the activations")
        else:
            ratio = f" ({self.ratio:.2f}x)" if self.ratio is not None else ""
            budget = f", budget {fmt_bytes(self.budget)} ({'fits' if self.fits else 'does NOT fit'})" if self.budget is not None else ""
            lines.append(f"  activations held for backward: {fmt_bytes(self.activations_before)} -> {fmt_bytes(self.activations_after)}{ratio}{budget}")
            lines.append(f"  peak of forward + backward: {fmt_bytes(self.peak_before)} -> {fmt_bytes(self.peak_after)}")
            lines.append(f"  measured under {self.policy} on {self.method} tensors with the example batch")
        return "\n".join(lines)
