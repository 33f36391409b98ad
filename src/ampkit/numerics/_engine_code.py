"""The ``Engine(...)`` line the doctor prints for a prescription: one formatter, so every line it prints reads alike
and pastes as is. A module type (an entry of ``keep_fp32`` that covers every module of that type) is written as
``nn.<Name>``, as ``from torch import nn`` names it.

    >>> engine_code("bf16-true", ["h.0.ln_1", "ln_f"])
    'Engine(precision="bf16-true", keep_fp32=["h.0.ln_1", "ln_f"])'
    >>> engine_code("16-mixed", scaler={"init_scale": 8192.0})
    'Engine(precision="16-mixed", scaler=ScalerConfig(init_scale=8192.0))'
    >>> from torch import nn
    >>> engine_code("bf16-mixed", [nn.BatchNorm2d, "fc"])
    'Engine(precision="bf16-mixed", keep_fp32=[nn.BatchNorm2d, "fc"])'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["engine_code", "keep_entry"]


def keep_entry(entry: object) -> str:
    """One ``keep_fp32`` entry as Python source: a module name quoted, a module type as ``nn.<Name>`` (a torch.nn
    class) or its dotted path."""
    if isinstance(entry, type):
        return f"nn.{entry.__name__}" if entry.__module__.startswith("torch.nn") else f"{entry.__module__}.{entry.__qualname__}"
    return f'"{entry}"'


def engine_code(precision: str, keep_fp32: Sequence[object] = (), scaler: Mapping[str, float] | None = None) -> str:
    """The Python line that builds an :class:`~ampkit.Engine` with this precision, fp32 modules and scaler settings."""
    parts = [f'precision="{precision}"']
    if keep_fp32:
        parts.append("keep_fp32=[" + ", ".join(keep_entry(n) for n in keep_fp32) + "]")
    if scaler:
        parts.append("scaler=ScalerConfig(" + ", ".join(f"{k}={v!r}" for k, v in scaler.items()) + ")")
    return f"Engine({', '.join(parts)})"
