"""The formatters of bench figures; they live in :mod:`ampkit._util.units` so that every layer can use them."""

from .._util.units import MISSING, fmt_bytes, fmt_float, fmt_flops, fmt_number, fmt_percent, fmt_ratio, fmt_seconds, fmt_share, is_missing

__all__ = ["MISSING", "is_missing", "fmt_bytes", "fmt_seconds", "fmt_ratio", "fmt_percent", "fmt_share", "fmt_number", "fmt_flops", "fmt_float"]
