"""Host-side statistics of a set of values, as read from a :class:`~ampkit.numerics.StatsAccumulator`.

:class:`TensorStats` holds the histogram of binary exponents and the counters in plain Python numbers, and
answers what share of the values would underflow, be subnormal or overflow in fp16 and bf16 (before and after
a loss scale), how large the rounding error of a cast is, and how parts combine (:meth:`TensorStats.merge`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ._formats import FORMATS, Format

__all__ = ["TensorStats", "E_LO", "E_HI", "NBINS"]

E_LO, E_HI = -150, 127
"""Histogram bins: ``floor(log2|x|)`` from below fp32's smallest subnormal (2^-149) to its largest exponent."""
NBINS = E_HI - E_LO + 1

_FORMATS = {f.name: f for f in FORMATS}


@dataclass(kw_only=True)
class TensorStats:
    """Host-side statistics of a set of values (see :class:`~ampkit.numerics.StatsAccumulator`); combine with :meth:`merge`."""

    count: int = 0
    """Values seen (all of them: zeros and non-finite included)."""
    zeros: int = 0
    nonfinite: int = 0
    """Values already inf/NaN in the tensor read (fp32 in the doctor's reference run)."""
    overflow: dict[str, int] = field(default_factory=lambda: {"fp16": 0, "bf16": 0})
    """Magnitudes above each format's largest finite value."""
    histogram: list[int] = field(default_factory=lambda: [0] * NBINS)
    """Non-zero finite values per binary exponent ``floor(log2|x|)``, from :data:`E_LO` to :data:`E_HI`."""
    max_abs: float = 0.0
    min_abs_nonzero: float = 0.0
    squares: list[float] | None = None
    """Sums of squares ``(fp16 error, fp16 reference, bf16 error, bf16 reference)``; None when not measured."""

    # -- counts and shares ------------------------------------------------------------------------
    def _bins(self, lo: int | None, hi: int | None) -> int:
        """Values whose exponent lies in ``[lo, hi]`` (either end open when None)."""
        start = 0 if lo is None else min(max(lo - E_LO, 0), NBINS)
        stop = NBINS if hi is None else min(max(hi - E_LO + 1, 0), NBINS)
        return sum(self.histogram[start:stop])

    def underflow(self, fmt: str | Format, scale_log2: int = 0) -> int:
        """Non-zero values that would flush to zero in ``fmt`` (below its smallest subnormal) after multiplying
        by ``2^scale_log2``."""
        f = _format(fmt)
        return self._bins(None, f.exponent_range[0] - 1 - scale_log2)

    def subnormal(self, fmt: str | Format, scale_log2: int = 0) -> int:
        """Values that would be subnormal in ``fmt`` (fewer significant bits) after scaling by ``2^scale_log2``."""
        f = _format(fmt)
        return self._bins(f.exponent_range[0] - scale_log2, f.normal_exponent - 1 - scale_log2)

    def underflow_share(self, fmt: str | Format, scale_log2: int = 0) -> float:
        """:meth:`underflow` as a share of all values."""
        return self.underflow(fmt, scale_log2) / self.count if self.count else 0.0

    def share(self, fmt: str | Format, what: str) -> float:
        """Share of all values that ``underflow``, are ``subnormal`` or ``overflow`` in ``fmt`` (unscaled)."""
        if not self.count:
            return 0.0
        name = _format(fmt).name
        counts = {"underflow": self.underflow(name), "subnormal": self.subnormal(name), "overflow": self.overflow[name]}
        if what not in counts:
            raise ValueError(f"share(..., {what!r}): ask for 'underflow', 'subnormal' or 'overflow'.")
        return counts[what] / self.count

    def rel_error(self, fmt: str | Format) -> float | None:
        """Relative rounding error of a cast to ``fmt``, ``||x - cast(x)|| / ||x||`` over the values that stay finite.

        Flushed and subnormal values count at their full loss; None when not measured or all values are zero.
        """
        if self.squares is None:
            return None
        err, ref = self.squares[0:2] if _format(fmt).name == "fp16" else self.squares[2:4]
        return math.sqrt(err / ref) if ref > 0 else None

    @property
    def range_bits(self) -> float:
        """Dynamic range of the non-zero values in binades: ``log2(max|x| / min|x|)``; 0 with fewer than two."""
        if self.min_abs_nonzero <= 0 or self.max_abs <= 0:
            return 0.0
        return math.log2(self.max_abs / self.min_abs_nonzero)

    # -- combining and export -----------------------------------------------------------------------
    @classmethod
    def merge(cls, parts: Iterable[TensorStats]) -> TensorStats:
        """The statistics of all values of ``parts`` together.

        >>> import torch
        >>> from ampkit.numerics._stats import StatsAccumulator
        >>> a, b = StatsAccumulator(), StatsAccumulator()
        >>> a.update(torch.tensor([1.0])); b.update(torch.tensor([0.0, 4.0]))
        >>> m = TensorStats.merge([a.summary(), b.summary()]); (m.count, m.zeros, m.max_abs, m.range_bits)
        (3, 1, 4.0, 2.0)
        """
        parts = [p for p in parts if p.count]
        out = cls()
        if not parts:
            return out
        out.count = sum(p.count for p in parts)
        out.zeros = sum(p.zeros for p in parts)
        out.nonfinite = sum(p.nonfinite for p in parts)
        out.overflow = {k: sum(p.overflow[k] for p in parts) for k in out.overflow}
        out.histogram = [sum(col) for col in zip(*(p.histogram for p in parts))]
        out.max_abs = max(p.max_abs for p in parts)
        nonzero = [p.min_abs_nonzero for p in parts if p.min_abs_nonzero > 0]
        out.min_abs_nonzero = min(nonzero) if nonzero else 0.0
        if all(p.squares is not None for p in parts):
            out.squares = [sum(col) for col in zip(*(p.squares for p in parts))]  # type: ignore[misc]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form: shares, extremes, rounding errors, and the histogram trimmed to its non-empty bins.

        ``histogram`` is ``{"exponent_lo": e, "counts": [...]}``: ``counts[i]`` values have ``floor(log2|x|) = e + i``.
        """
        nonzero = [i for i, c in enumerate(self.histogram) if c]
        lo, hi = (nonzero[0], nonzero[-1]) if nonzero else (0, -1)
        out: dict[str, Any] = {"count": self.count, "zero_share": self.zeros / self.count if self.count else 0.0}
        out["nonfinite_share"] = self.nonfinite / self.count if self.count else 0.0
        for f in FORMATS:
            for what in ("underflow", "subnormal", "overflow"):
                out[f"{f.name}_{what}_share"] = self.share(f, what)
            out[f"{f.name}_rel_error"] = self.rel_error(f)
        out.update(max_abs=self.max_abs, min_abs_nonzero=self.min_abs_nonzero, range_bits=self.range_bits)
        out["histogram"] = {"exponent_lo": E_LO + lo if nonzero else 0, "counts": self.histogram[lo : hi + 1]}
        return out


def _format(fmt: str | Format) -> Format:
    # By name, not isinstance: a Format from another import of this package (doctests) is the same format.
    name = fmt if isinstance(fmt, str) else getattr(fmt, "name", None)
    if name not in _FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(_FORMATS)}.")
    return _FORMATS[name]
