"""What a :class:`~ampkit.memory.MemoryTracker` records: one :class:`MemorySample` a step, and a
:class:`MemorySummary` of the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .._util.units import fmt_bytes

__all__ = ["MemorySample", "MemorySummary"]


@dataclass(frozen=True, slots=True)
class MemorySample:
    """Memory after one training step, in bytes; None where the device or mode has no such figure."""

    step: int
    """1 for the first call of :meth:`MemoryTracker.step`, and so on."""
    allocated: int | None
    """Bytes of live tensors. CUDA: ``torch.cuda.memory_allocated``. CPU: the live storages counted by
    :class:`~ampkit.memory.LiveBytes` (None with ``accounted=False``)."""
    reserved: int | None
    """CUDA: the bytes the caching allocator holds (allocated plus its cache). None on the CPU, where no cache
    sits between tensors and the process (RSS is reported as ``rss``, not folded in here)."""
    peak: int | None
    """The most bytes of live tensors at any moment since the previous sample: the step's own peak."""
    rss: int | None
    """The process's resident set size (host memory, on CUDA runs too); None where /proc is missing."""


@dataclass(frozen=True, slots=True)
class MemorySummary:
    """What a :class:`MemoryTracker` saw over a run. Growth rates are least-squares slopes, in bytes per step,
    over the steps after the warmup."""

    device: str
    steps: int
    start: int | None
    """Bytes of live tensors when tracking began (``allocated`` before the first step)."""
    end: int | None
    """Bytes of live tensors after the last step."""
    peak: int | None
    """The most bytes of live tensors at any moment of the run."""
    growth_per_step: float | None
    """Slope of the live tensor bytes after each step; None before two samples past the warmup."""
    rss_start: int | None
    rss_end: int | None
    rss_growth_per_step: float | None
    peak_rss: int | None
    """The process's peak RSS (Linux ``VmHWM``): since it started, or since the last reset of that peak."""
    reserved: int | None
    """CUDA: bytes the caching allocator held after the last step."""
    warning: str | None
    """The steady-growth warning, when one was given."""
    note: str | None = None
    """CUDA: the note given when reserved memory grew while allocated memory did not (not a leak)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        def rate(r: float | None) -> str:
            return "" if r is None else f", {'+' if r >= 0 else '-'}{fmt_bytes(abs(r))}/step"

        lines = [f"memory over {self.steps} step(s) on {self.device}:"]
        if self.end is not None:
            lines.append(
                f"  tensors {fmt_bytes(self.start)} -> {fmt_bytes(self.end)} (peak {fmt_bytes(self.peak)}{rate(self.growth_per_step)})"
                + (f", reserved {fmt_bytes(self.reserved)}" if self.reserved is not None else "")
            )
        if self.rss_end is not None:
            peak = f", process peak {fmt_bytes(self.peak_rss)}" if self.peak_rss is not None else ""
            lines.append(f"  RSS {fmt_bytes(self.rss_start)} -> {fmt_bytes(self.rss_end)}{rate(self.rss_growth_per_step)}{peak}")
        lines.append(f"  {self.warning}" if self.warning else "  no steady growth")
        if self.note:
            lines.append(f"  {self.note}")
        return "\n".join(lines)
