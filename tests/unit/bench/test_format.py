"""Tests for the bench formatters: units, precision, rounding across unit boundaries, missing figures."""

from __future__ import annotations

import math

import pytest

from ampkit.bench._format import (
    MISSING,
    fmt_bytes,
    fmt_float,
    fmt_flops,
    fmt_number,
    fmt_percent,
    fmt_ratio,
    fmt_seconds,
    is_missing,
)

ALL = [fmt_bytes, fmt_seconds, fmt_ratio, fmt_percent, fmt_number, fmt_flops, fmt_float]


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("value", [None, float("nan")])
def test_missing_figures_render_as_a_dash(fmt, value) -> None:
    assert fmt(value) == MISSING == "—"


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (12_900_000, "12.3 MiB"),
        (150 * 2**20, "150 MiB"),
        (3 * 2**29, "1.50 GiB"),
        (2**20 - 1, "1.00 MiB"),  # 1023.999 KiB rounds to the next unit, not to "1020 KiB"
        (1010 * 2**10, "0.986 MiB"),  # three digits at most, so a column stays narrow
        (5 * 2**40, "5.00 TiB"),
        (-3 * 2**20, "-3.00 MiB"),
    ],
)
def test_fmt_bytes(n: int, expected: str) -> None:
    assert fmt_bytes(n) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.0200, "20.0 ms"),
        (0.01234, "12.3 ms"),
        (0.1234, "123 ms"),
        (0.000456, "0.456 ms"),
        (0.0999996, "100 ms"),  # rounded before choosing the decimals: not "100.0 ms"
        (1.2345, "1,234 ms"),  # still milliseconds, so a column of step times compares at a glance
    ],
)
def test_fmt_seconds(seconds: float, expected: str) -> None:
    assert fmt_seconds(seconds) == expected


def test_fmt_seconds_without_unit_for_ranges() -> None:
    assert fmt_seconds(0.0119, unit=False) == "11.9"
    assert fmt_seconds(None, unit=False) == MISSING


def test_fmt_ratio_and_percent() -> None:
    assert fmt_ratio(2.3111) == "2.31x"
    assert fmt_ratio(1) == "1.00x"
    assert fmt_percent(0.3) == "30.0%"
    assert fmt_percent(-0.125) == "-12.5%"
    assert fmt_percent(0.05, signed=True) == "+5.0%"
    assert fmt_percent(-0.14, digits=0, signed=True) == "-14%"


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [
        (12_345, "tokens/s", "12.3k tokens/s"),
        (850, "samples/s", "850 samples/s"),
        (999_960, "tokens/s", "1.00M tokens/s"),
        (2.5e6, None, "2.50M"),
        (5.5, None, "5.50"),
    ],
)
def test_fmt_number(value: float, unit: str | None, expected: str) -> None:
    assert fmt_number(value, unit) == expected


@pytest.mark.parametrize(
    ("flops", "expected"),
    [(1.2e12, "1.20 TFLOP/s"), (3.56e11, "356 GFLOP/s"), (4.2e15, "4.20 PFLOP/s"), (950.0, "950 FLOP/s")],
)
def test_fmt_flops(flops: float, expected: str) -> None:
    assert fmt_flops(flops) == expected


def test_fmt_float_keeps_infinity_visible() -> None:
    # A loss of inf is a finding (it overflowed), unlike NaN, which carries no figure at all.
    assert fmt_float(math.inf) == "inf"
    assert fmt_float(-math.inf) == "-inf"
    assert fmt_float(0.123456) == "0.1235"
    assert fmt_float(32768.0, 8) == "32768"


def test_is_missing() -> None:
    assert is_missing(None) and is_missing(math.nan)
    assert not is_missing(0) and not is_missing(0.0) and not is_missing(math.inf)
