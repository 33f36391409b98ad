"""The cells the doctor's tables share: a relative error, a cosine, a module's name.

The terminal's main table (:mod:`ampkit.numerics._table`), its fp8 headroom section
(:mod:`ampkit.numerics._fp8_table`) and report.md (:mod:`ampkit.numerics._report`) all print these; defined here,
below all three, each is written one way.

    >>> fmt_error(0.000488), fmt_cosine(0.99998712), module_label("")
    ('4.9e-04', '0.999987', '(model)')
"""

from __future__ import annotations

from .._util.units import MISSING, is_missing

__all__ = ["MODEL_LABEL", "fmt_cosine", "fmt_error", "module_label"]

MODEL_LABEL = "(model)"
"""How the root module (name ``""``) is shown: an empty cell would read as a missing name."""


def fmt_error(x: float | None) -> str:
    """A relative error in scientific notation, so a column of them lines up: ``4.9e-04``.

    >>> fmt_error(0.000488), fmt_error(0.0), fmt_error(None)
    ('4.9e-04', '0', '—')
    """
    return MISSING if is_missing(x) else "0" if x == 0 else f"{x:.1e}"


def fmt_cosine(x: float | None) -> str:
    """A cosine similarity to six decimals: the interesting ones differ from 1 in the fourth place or later.

    >>> fmt_cosine(0.99998712), fmt_cosine(None)
    ('0.999987', '—')
    """
    return MISSING if is_missing(x) else f"{x:.6f}"


def module_label(name: str | None) -> str:
    """A module's name as shown: the root module (``""``) is ``(model)``."""
    return name if name else MODEL_LABEL
