"""Numbers a user gives the bench, checked as text or as numbers: the same rule for a flag and for the API's argument.

They import nothing (no torch), so that the command line refuses ``--tolerance -1`` or ``--clip max`` before it
imports torch; :mod:`ampkit.bench._verdict` and :mod:`ampkit.bench._recipe` apply them to the API's arguments.

    >>> check_tolerance("0.01"), clip_from("none"), check_lr(1e-3)
    (0.01, None, 0.001)
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_lr", "check_tolerance", "clip_from"]


def check_tolerance(value: object, option: str = "tolerance") -> float:
    """``value`` as an eval tolerance: a non-negative finite number, else a ValueError that says what to pass.

    >>> check_tolerance("0.01"), check_tolerance(0)
    (0.01, 0.0)
    >>> check_tolerance("-1", "--tolerance")
    Traceback (most recent call last):
    ...
    ValueError: --tolerance must be a non-negative finite number (e.g. 0.01: one point of accuracy, or 1% of a relative metric such as perplexity); got '-1'
    """
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise ValueError(
            f"{option} must be a non-negative finite number (e.g. 0.01: one point of accuracy, or 1% of a relative "
            f"metric such as perplexity); got {value!r}"
        )
    return number


def clip_from(text: str) -> float | None:
    """``--clip`` as the engine takes it: a positive max norm, or None (off) for ``0``, ``none`` or ``off``.

    >>> clip_from("1.5"), clip_from("0"), clip_from("none")
    (1.5, None, None)
    >>> clip_from("-1")
    Traceback (most recent call last):
    ...
    ValueError: --clip -1: the gradient-norm clip must be a positive finite number; 0 or none turns clipping off.
    """
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--clip {text}: give a number (the max total gradient norm, e.g. 1.0), or 0 or none to turn clipping off.") from None
    if value == 0:
        return None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"--clip {text}: the gradient-norm clip must be a positive finite number; 0 or none turns clipping off.")
    return value


def check_lr(lr: Any, option: str = "--lr") -> float:
    """``lr`` as a learning rate: a positive finite number, else a ValueError naming ``option``.

    >>> check_lr(0)
    Traceback (most recent call last):
    ...
    ValueError: --lr 0: the learning rate must be a positive finite number (e.g. 1e-4).
    """
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{option} {lr!r}: the learning rate must be a positive finite number (e.g. 1e-4).")
    return float(lr)
