"""Bytes as people read them, in every table and message of the tune.

    >>> fmt_bytes(512), fmt_bytes(3 * 2**20), fmt_bytes(5 * 2**30), fmt_bytes(None)
    ('512 B', '3.0 MiB', '5.00 GiB', '-')
"""

from __future__ import annotations

__all__ = ["fmt_bytes"]


def fmt_bytes(n: int | None) -> str:
    """``n`` bytes in B, KiB, MiB or GiB (``-`` for None: not measured)."""
    if n is None:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"
