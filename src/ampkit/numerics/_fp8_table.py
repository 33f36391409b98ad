"""The fp8 headroom section of a doctor result, as rows and lines shared by the terminal and report.md.

Everything reads doctor.json's ``fp8_headroom`` (:meth:`ampkit.numerics._fp8_headroom.Fp8Headroom.to_dict`),
whose layers are already sorted worst first.

    >>> data = {"recipe": "tensorwise", "flush_limit": 0.01, "fine": 1, "layers": [
    ...     {"name": "fc", "shape": [4, 8], "flagged": False, "problems": [], "operands": {
    ...         "grad_output": {"format": "e5m2", "amax": 0.5, "nonfinite": None, "flushed_share": 0.002, "rel_error": 0.03}}}]}
    >>> rows = headroom_rows(data)
    >>> rows.headers, rows.rows
    (['Linear', 'Shape', 'Grad out amax', 'Grad out flushed / error', 'Problems'], [['fc', '4×8', 'e5m2 5.0e-01', '0.20% / 3.0e-02', '']])
    >>> headroom_summary(data)
    'fp8 headroom (tensorwise recipe): every Linear layer fine, 1 of 1: at most 1% of nonzero values flushed, error within fp8 rounding'
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._report.tables import TableRows
from .._util.units import MISSING, fmt_share
from ..policy._fp8_matmuls import CONV1D, conv1d_note
from ._cells import fmt_error, module_label

__all__ = ["FP8_TOP", "headroom_rows", "headroom_summary", "render_headroom"]

FP8_TOP = 10
"""Linear layers the terminal shows, worst first; doctor.json holds them all."""

_LABELS = {"input": "Input", "weight": "Weight", "grad_output": "Grad out"}


def _amax_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return MISSING
    if entry.get("nonfinite"):
        return f"{entry['format']} {entry['nonfinite']}"
    return f"{entry['format']} {entry['amax']:.1e}"


def _loss_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return MISSING
    if entry.get("nonfinite"):
        return "scale breaks"
    return f"{fmt_share(entry.get('flushed_share'))} / {fmt_error(entry.get('rel_error'))}"


def headroom_rows(data: dict[str, Any], top: int | None = FP8_TOP) -> TableRows:
    """The per-Linear table, worst first, at most ``top`` rows (all when None): per operand the format and amax,
    then the share of nonzero values flushed to zero and the round trip's relative error."""
    layers = data.get("layers") or []
    present = [op for op in _LABELS if any(op in (layer.get("operands") or {}) for layer in layers)]
    headers = ["Linear", "Shape"] + [h for op in present for h in (f"{_LABELS[op]} amax", f"{_LABELS[op]} flushed / error")] + ["Problems"]
    rows = []
    for layer in layers if top is None else layers[:top]:
        operands = layer.get("operands") or {}
        cells = [c for op in present for c in (_amax_cell(operands.get(op)), _loss_cell(operands.get(op)))]
        shape = "×".join(str(d) for d in layer.get("shape") or []) or MISSING
        kind = layer.get("kind") or "Linear"
        label = module_label(layer.get("name")) + (f" ({kind})" if kind != "Linear" else "")  # torchao does not convert it
        rows.append([label, shape, *cells, "; ".join(layer.get("problems") or [])])
    return TableRows(headers=headers, rows=rows, justify=["left"] + ["right"] * (len(headers) - 2) + ["left"])


def headroom_summary(data: dict[str, Any]) -> str:
    """One line: the recipe, and how many Linear layers are fine or flagged."""
    layers = data.get("layers") or []
    head = f"fp8 headroom ({data.get('recipe') or MISSING} recipe): "
    if not layers:
        return head + "no nn.Linear layers: torchao's float8 training converts only those, so fp8 changes nothing here"
    rule = f"at most {float(data.get('flush_limit') or 0):.0%} of nonzero values flushed, error within fp8 rounding"
    fine, flagged = data.get("fine", 0), len(layers) - data.get("fine", 0)
    conv1d = conv1d_note(sum((layer.get("kind") or "Linear") == CONV1D for layer in layers), len(layers))
    # A Conv1D row shows what fp8 would do to the layer once it is an nn.Linear: measured all the same.
    tail = f". {conv1d} Their rows show what fp8 would do to them once converted" if conv1d else ""
    if not flagged:
        return head + f"every Linear layer fine, {fine} of {len(layers)}: {rule}{tail}"
    return head + f"{flagged} of {len(layers)} Linear layers flagged, {fine} fine ({rule}){tail}"


def render_headroom(data: dict[str, Any], console: Console, top: int = FP8_TOP) -> None:
    """Print the section to ``console``: the summary line, then the worst ``top`` layers (flagged ones in red)."""
    console.print(Text(headroom_summary(data), style="bold"))
    layers = data.get("layers") or []
    if not layers:
        return
    rows = headroom_rows(data, top)
    table = Table(header_style="bold")
    for header, justify in zip(rows.headers, rows.justify):
        table.add_column(header, justify=justify, no_wrap=header not in ("Linear", "Problems"))  # type: ignore[arg-type]
    for layer, cells in zip(layers, rows.rows):
        table.add_row(*(Text(c) for c in cells), style="red" if layer.get("flagged") else None)
    console.print(table)
    if len(layers) > top:
        console.print(Text(f"... {len(layers) - top} more in doctor.json", style="dim"))
