"""Figures as text and back: small, pure formatters (the terminal tables, the reports and the plots all use
these) and :func:`parse_bytes` for sizes a user writes.

Every formatter takes a figure that might be missing (``None``) or not a number (``NaN``, e.g. the final loss
of a diverged run) and renders it as :data:`MISSING`, so callers never have to check. Numbers are shown to
three significant digits, which is more than the run-to-run noise of a benchmark warrants.

    >>> fmt_bytes(12_900_000), fmt_seconds(0.01234), fmt_ratio(2.3111), fmt_percent(0.3)
    ('12.3 MiB', '12.3 ms', '2.31x', '30.0%')
    >>> fmt_number(12_345, "tokens/s"), fmt_flops(1.2e12), fmt_bytes(None), fmt_float(float("nan"))
    ('12.3k tokens/s', '1.20 TFLOP/s', '—', '—')

It imports nothing from ampkit, so that every layer can use it without loading another.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "MISSING",
    "is_missing",
    "fmt_bytes",
    "fmt_seconds",
    "fmt_ratio",
    "fmt_percent",
    "fmt_share",
    "fmt_number",
    "fmt_flops",
    "fmt_float",
    "parse_bytes",
]

MISSING = "—"
"""What a missing or not-a-number figure renders as."""

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI = ("", "k", "M", "G", "T", "P", "E")


def is_missing(value: float | None) -> bool:
    """True for ``None`` and NaN: figures that should render as :data:`MISSING`.

    >>> is_missing(None), is_missing(float("nan")), is_missing(float("inf")), is_missing(0)
    (True, True, False, False)
    """
    return value is None or (isinstance(value, float) and math.isnan(value))


def _sig3(value: float) -> str:
    """``value`` to three significant digits, without an exponent for the magnitudes the bench produces."""
    value = float(f"{value:.3g}")  # round first, so 99.96 becomes "100" and not "100.0"
    size = abs(value)
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _scaled(value: float, base: float, prefixes: tuple[str, ...]) -> tuple[str, str]:
    """``value`` divided down to the largest prefix it reaches (after rounding), as (digits, prefix)."""
    exponent = 0
    while exponent < len(prefixes) - 1 and abs(value) >= base ** (exponent + 1):
        exponent += 1
    # Never four digits before the point: 999.96k and 1023.9 KiB read as 1.00M and 1.00 MiB, not 1000k or 1020 KiB.
    if exponent < len(prefixes) - 1 and abs(float(f"{value / base**exponent:.3g}")) >= 1000:
        exponent += 1
    return _sig3(value / base**exponent), prefixes[exponent]


def fmt_bytes(n: float | None) -> str:
    """Bytes in binary units: ``"512 B"``, ``"12.3 MiB"``, ``"1.50 GiB"``.

    >>> fmt_bytes(512), fmt_bytes(1536), fmt_bytes(3 * 2**29), fmt_bytes(None)
    ('512 B', '1.50 KiB', '1.50 GiB', '—')
    """
    if is_missing(n):
        return MISSING
    assert n is not None
    if math.isinf(n):
        return "inf B"
    if abs(n) < 1024:
        return f"{n:.0f} B"  # whole bytes: "512 B", never "512.00 B"
    digits, unit = _scaled(n, 1024, _BINARY)
    return f"{digits} {unit}"


def fmt_seconds(s: float | None, *, unit: bool = True) -> str:
    """Seconds shown in milliseconds, the scale of one training step: ``"12.3 ms"``, ``"0.456 ms"``, ``"1,234 ms"``.

    Milliseconds throughout (no switch to seconds) so a column of step times lines up and compares at a glance.
    ``unit=False`` drops the ``" ms"``, for ranges such as ``11.9–13.0``.

    >>> fmt_seconds(0.000456), fmt_seconds(1.2345), fmt_seconds(0.0119, unit=False), fmt_seconds(None)
    ('0.456 ms', '1,234 ms', '11.9', '—')
    """
    if is_missing(s):
        return MISSING
    assert s is not None
    ms = s * 1000.0
    text = f"{ms:,.0f}" if abs(ms) >= 1000 else _sig3(ms)
    return f"{text} ms" if unit else text


def fmt_ratio(x: float | None) -> str:
    """A ratio such as a speed-up: ``"2.31x"``.

    >>> fmt_ratio(2.3111), fmt_ratio(0.5), fmt_ratio(float("nan"))
    ('2.31x', '0.50x', '—')
    """
    return MISSING if is_missing(x) else f"{x:.2f}x"


def fmt_percent(x: float | None, *, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage: ``0.3`` is ``"30.0%"``; ``signed=True`` always shows the sign.

    >>> fmt_percent(0.3), fmt_percent(-0.125), fmt_percent(0.05, signed=True), fmt_percent(0.42, digits=0)
    ('30.0%', '-12.5%', '+5.0%', '42%')
    """
    if is_missing(x):
        return MISSING
    assert x is not None
    return f"{x * 100:{'+' if signed else ''}.{digits}f}%"


_SHARE_TINY = 1e-4
"""Shares below this (0.01%) print as ``<0.01%``: a handful of flushed gradients is a finding, not zero."""


def fmt_share(x: float | None) -> str:
    """A share of values as a percentage that never hides a non-zero share behind ``0.00%`` or a shortfall
    behind ``100.0%``; exactly none is ``0%``.

    >>> fmt_share(0.0), fmt_share(3e-7), fmt_share(0.0042), fmt_share(0.25), fmt_share(0.99999), fmt_share(None)
    ('0%', '<0.01%', '0.42%', '25.0%', '>99.99%', '—')
    """
    if is_missing(x):
        return MISSING
    assert x is not None
    if x <= 0:
        return "0%"
    if x >= 1:
        return "100%"
    if x < _SHARE_TINY:
        return "<0.01%"
    if x > 1 - _SHARE_TINY:
        return ">99.99%"
    # Two decimals where one would round a real share to 0.0% or 100.0%; one elsewhere, like the bench.
    return fmt_percent(x, digits=2 if x < 0.01 or x > 0.999 else 1)


def fmt_number(x: float | None, unit: str | None = None) -> str:
    """A count or rate with an SI prefix and an optional unit: ``"12.3k tokens/s"``, ``"850 samples/s"``.

    >>> fmt_number(12_345, "tokens/s"), fmt_number(850, "samples/s"), fmt_number(2.5e6), fmt_number(None, "x")
    ('12.3k tokens/s', '850 samples/s', '2.50M', '—')
    """
    if is_missing(x):
        return MISSING
    assert x is not None
    digits, prefix = _scaled(x, 1000, _SI)
    return f"{digits}{prefix} {unit}" if unit else f"{digits}{prefix}"


def fmt_flops(x: float | None) -> str:
    """Floating-point operations per second: ``"1.20 TFLOP/s"``, ``"356 GFLOP/s"``.

    >>> fmt_flops(1.2e12), fmt_flops(3.56e11), fmt_flops(None)
    ('1.20 TFLOP/s', '356 GFLOP/s', '—')
    """
    if is_missing(x):
        return MISSING
    assert x is not None
    digits, prefix = _scaled(x, 1000, _SI)
    return f"{digits} {prefix}FLOP/s"


def fmt_float(x: float | None, digits: int = 4) -> str:
    """A plain figure (loss, eval metric, loss scale) to ``digits`` significant digits; infinity stays visible.

    >>> fmt_float(0.123456), fmt_float(65536.0, 8), fmt_float(float("inf")), fmt_float(None)
    ('0.1235', '65536', 'inf', '—')
    """
    if is_missing(x):
        return MISSING
    assert x is not None
    return f"{x:.{digits}g}"


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"80 GB"``, ``"512MiB"`` or a plain number of bytes, as bytes.

    >>> parse_bytes("24GiB"), parse_bytes("1.5 GB"), parse_bytes("4096")
    (25769803776, 1500000000, 4096)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a memory size; write it like 24GiB, 80GB, 512MiB or a number of bytes.")
    return int(float(m.group(1)) * _UNITS[unit])
