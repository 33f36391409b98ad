"""Growth over the steps of a training loop: the per-step series a tracker keeps, and what in them rises steadily.

Live tensor bytes and the process heap are judged over a window of steps: growth is reported when the floor
of each quarter of the window is above the previous quarter's, and the rise reaches a minimum. A loss's autograd
graph is marked so that graphs kept across steps are seen whether or not memory grows enough to show.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch

from .._util.units import fmt_bytes
from ._leak_holders import Growth

__all__: list[str] = []  # private helpers of ampkit.memory._tracker

_BLOCKS = 4
"""Growth must show in each quarter of the window: its floor (lowest value) rises from quarter to quarter."""

_RSS_NOISE = 4096
"""Heap growth below a page a step is not judged: the creep of Python objects (this tracker's samples among them)."""

_MARK = "ampkit.memory._tracker"
"""Key of the marker this tracker puts in the metadata of a loss's autograd node."""


class _Fit:
    """Running least-squares slope of y over x: exact integer sums, O(1) per point, nothing kept per point."""

    __slots__ = ("n", "sx", "sxx", "sxy", "sy")

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxy = self.sxx = 0

    def add(self, x: int, y: int) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxy += x * y
        self.sxx += x * x

    @property
    def slope(self) -> float | None:
        den = self.n * self.sxx - self.sx * self.sx
        return None if self.n < 2 or den == 0 else (self.n * self.sxy - self.sx * self.sy) / den


def _slope(values: Sequence[int]) -> float:
    fit = _Fit()
    for i, v in enumerate(values):
        fit.add(i, v)
    return fit.slope or 0.0


def _steady_rise(values: Sequence[int], min_growth: float) -> float | None:
    """Bytes gained over ``values`` (slope times span) when they grew steadily by at least ``min_growth``.

    Steady: the floor of each quarter is above the floor of the one before. Noise and the ups and downs of
    batches of varying size do not lift every floor; a one-off allocation lifts one; a leak lifts them all.
    """
    size = len(values) // _BLOCKS
    tail = list(values)[len(values) - size * _BLOCKS :]
    floors = [min(tail[i * size : (i + 1) * size]) for i in range(_BLOCKS)]
    if not all(a < b for a, b in pairwise(floors)):
        return None
    rise = _slope(values) * (len(values) - 1)
    return rise if rise >= min_growth else None


class _GraphMark:
    """Put in the metadata of a loss's autograd node: it lives exactly as long as that graph does."""

    __slots__ = ("__weakref__",)


class _GrowthDetector:
    """The values after each step past the warmup (the last ``window`` of them, and a running fit of all), the
    marks on the losses' autograd graphs, and the growth they show."""

    def __init__(self, window: int, min_growth: float, cuda: bool) -> None:
        self.window, self.min_growth, self.cuda = window, min_growth, cuda
        self.series = {name: deque(maxlen=window) for name in ("tensors", "heap", "reserved")}
        self.fits = {name: _Fit() for name in ("tensors", "rss")}
        self.marks: deque[tuple[int, weakref.ref[_GraphMark]]] = deque(maxlen=window)

    def add(self, n: int, allocated: int | None, heap: int | None, reserved: int | None, rss: int | None, loss: Any) -> None:
        """Record step ``n`` (past the warmup); None where the device or mode has no such figure."""
        for name, value in (("tensors", allocated), ("heap", heap), ("reserved", reserved)):
            if value is not None:
                self.series[name].append(value)
        for name, value in (("tensors", allocated), ("rss", rss)):
            if value is not None:
                self.fits[name].add(n, value)
        if isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            self._mark(n, loss)

    def _mark(self, n: int, loss: torch.Tensor) -> None:
        mark = _GraphMark()
        try:
            loss.grad_fn.metadata[_MARK] = mark  # owned by the node: freed with the graph, not before
        except (AttributeError, RuntimeError, TypeError):
            return
        self.marks.append((n, weakref.ref(mark)))

    def growth(self, n: int) -> Growth | None:
        marks = self.marks
        if len(marks) == marks.maxlen:
            alive = sum(ref() is not None for _, ref in marks)
            if marks[0][1]() is not None and 2 * alive >= len(marks):
                first = marks[0][0]
                return Growth(
                    "graph", n,
                    f"the autograd graph of step {first}'s loss is still alive {n - first} step(s) later, and so are those of "
                    f"{alive} of the last {len(marks)} steps' losses",
                )
        for kind, least in (("tensors", self.min_growth), ("heap", max(self.min_growth, _RSS_NOISE * (self.window - 1)))):
            values = self.series[kind]
            if len(values) == self.window:
                rise = _steady_rise(values, least)
                if rise is not None and kind == "heap":
                    rise -= self._tensor_rise()
                if rise is not None and rise >= least:
                    return Growth(kind, n, self._growth_text(kind, n))
        return None

    def _tensor_rise(self) -> float:
        """On the CPU, the live tensors' growth over the window: it is heap growth too, but the tensor finding's. A
        leak that starts mid-window lifts the heap (with any slow creep beside it) before the tensors' own rise is
        steady; without this the heap would be reported first, naming no tensor."""
        tensors = self.series["tensors"]
        if self.cuda or len(tensors) != self.window:
            return 0.0
        return max(0.0, _slope(tensors) * (len(tensors) - 1))

    def _growth_text(self, kind: str, n: int) -> str:
        values = self.series[kind]
        what = "process heap (anonymous RSS)" if kind == "heap" else (
            "allocated CUDA memory" if self.cuda else "live tensor memory"
        )
        text = f"{what} grows steadily: +{fmt_bytes(_slope(values))}/step over the last {len(values)} steps ({fmt_bytes(values[0])} -> {fmt_bytes(values[-1])} at step {n})"
        other = self.series["tensors" if kind == "heap" else "heap"]
        if len(other) == len(values):
            rate = _slope(other)
            label = "live tensor memory" if kind == "heap" else "process heap"
            text += f"; {label} {'+' if rate >= 0 else '-'}{fmt_bytes(abs(rate))}/step"
        return text

    def reserved_note(self, n: int) -> str | None:
        """CUDA: the note to give when reserved memory grows steadily while allocated memory does not."""
        reserved, allocated = self.series["reserved"], self.series["tensors"]
        if len(reserved) < self.window or _steady_rise(reserved, self.min_growth) is None:
            return None
        if _slope(allocated) * (len(allocated) - 1) >= self.min_growth:
            return None  # allocated grows too: that is the finding, and is reported as such
        return (
            f"CUDA reserved memory grows (+{fmt_bytes(_slope(reserved))}/step over the last {len(reserved)} steps, {fmt_bytes(reserved[-1])} "
            f"at step {n}) while allocated memory stays flat ({fmt_bytes(allocated[-1])}): the caching allocator keeps more "
            "free blocks (fragmentation, or batches of changing shapes), which is not a leak; "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually curbs it."
        )
