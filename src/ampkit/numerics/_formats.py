"""The 16-bit floating-point formats a mixed-precision policy stores values in, and where each runs out.

Thresholds are powers of two except the largest finite values, so a histogram of binary exponents
(``floor(log2|x|)``, see :mod:`ampkit.numerics._stats`) tells exactly which values fall below a format's
range, and scaling by a power of two (a loss scale) shifts that histogram by whole bins.

    >>> FP16.max, FP16.min_normal == 2.0**-14, FP16.min_subnormal == 2.0**-24
    (65504.0, True, True)
    >>> FP16.exponent_range   # floor(log2|x|) of the values fp16 holds: 2^-24 up to 65504
    (-24, 15)
    >>> BF16.exponent_range
    (-133, 127)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Format", "FP16", "BF16", "FORMATS", "format_of"]


@dataclass(frozen=True, slots=True)
class Format:
    """A floating-point format's range: largest finite value, smallest normal and smallest subnormal."""

    name: str
    """``fp16`` or ``bf16``: the key used in statistics (``fp16_underflow_share``...)."""
    dtype: torch.dtype
    max: float
    """Largest finite value; larger magnitudes overflow (to inf once rounding passes it)."""
    min_normal: float
    """Smallest normal value; below it values are subnormal and keep fewer significant bits."""
    min_subnormal: float
    """Smallest non-zero value; magnitudes below it flush to zero (or round up to it)."""
    mantissa_bits: int
    """Explicit mantissa bits: the relative rounding error of a normal value is at most 2^-(bits+1)."""

    @property
    def exponent_range(self) -> tuple[int, int]:
        """``(lowest, highest)`` binary exponent ``floor(log2|x|)`` of a non-zero finite value of the format."""
        return _log2_floor(self.min_subnormal), _log2_floor(self.max)

    @property
    def normal_exponent(self) -> int:
        """``floor(log2)`` of the smallest normal value: exponents below it are subnormal."""
        return _log2_floor(self.min_normal)


def _log2_floor(x: float) -> int:
    import math

    return math.frexp(x)[1] - 1


FP16 = Format(name="fp16", dtype=torch.float16, max=65504.0, min_normal=2.0**-14, min_subnormal=2.0**-24, mantissa_bits=10)
BF16 = Format(
    name="bf16", dtype=torch.bfloat16, max=float(torch.finfo(torch.bfloat16).max), min_normal=2.0**-126, min_subnormal=2.0**-133, mantissa_bits=7
)
FORMATS: tuple[Format, ...] = (FP16, BF16)


def format_of(dtype: torch.dtype | None) -> Format | None:
    """The :class:`Format` of a 16-bit ``dtype``; None for fp32 (or no dtype: the policy computes in fp32).

    >>> format_of(torch.bfloat16).name, format_of(torch.float32)
    ('bf16', None)
    """
    return next((f for f in FORMATS if f.dtype == dtype), None)
