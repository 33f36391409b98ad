"""The ``Engine(...)`` line the doctor prints for a prescription: one formatter, so every line it prints reads alike
and pastes as is.

    >>> engine_code("bf16-true", ["h.0.ln_1", "ln_f"])
    'Engine(precision="bf16-true", keep_fp32=["h.0.ln_1", "ln_f"])'
    >>> engine_code("16-mixed", scaler={"init_scale": 8192.0})
    'Engine(precision="16-mixed", scaler=ScalerConfig(init_scale=8192.0))'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["engine_code"]


def engine_code(precision: str, keep_fp32: Sequence[str] = (), scaler: Mapping[str, float] | None = None) -> str:
    """The Python line that builds an :class:`~ampkit.Engine` with this precision, fp32 modules and scaler settings."""
    parts = [f'precision="{precision}"']
    if keep_fp32:
        parts.append("keep_fp32=[" + ", ".join(f'"{n}"' for n in keep_fp32) + "]")
    if scaler:
        parts.append("scaler=ScalerConfig(" + ", ".join(f"{k}={v!r}" for k, v in scaler.items()) + ")")
    return f"Engine({', '.join(parts)})"
