"""The doctor's module table: the modules worst first, one row of plain cells each (defined once, for the terminal
and report.md alike), their findings split into problems and things to watch, and the rich table fitted to the
terminal's width by leaving out the least needed columns.

    >>> data = {"modules": [{"name": "fc", "type": "Linear", "severity": 0.5}, {"name": "out", "type": "Linear", "severity": 2.0}]}
    >>> [m["name"] for m in ranked_modules(data)], module_rows(data).rows[0][:2]
    (['out', 'fc'], ['out', 'Linear'])
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from .._report.tables import TableRows, column_widths, table_width
from .._util.units import MISSING, fmt_share, is_missing
from ._cells import fmt_cosine, fmt_error, module_label
from ._formats import FP16

__all__ = ["TOP", "build_table", "module_rows", "ranked_modules", "scaled_underflow_share", "split_problems"]

TOP = 20
"""Modules the terminal shows; the rest are in doctor.json (and report.md shows more)."""


def _severity(module: dict[str, Any]) -> float:
    value = module.get("severity")
    return 0.0 if is_missing(value) else float(value)


def ranked_modules(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The modules worst first (severity descending); ties keep the model's order."""
    modules = data.get("modules") or []
    return sorted(modules, key=lambda m: (-_severity(m), m.get("order", 0)))


def scaled_underflow_share(stats: dict[str, Any] | None, scale_log2: int | None) -> float | None:
    """Share of ``stats``' values that still flush to zero in fp16 once multiplied by ``2^scale_log2``.

    Read from the exponent histogram: a value of exponent ``e`` lands at ``e + k``, and fp16 holds nothing below
    exponent -24 (2^-24, its smallest subnormal).

    >>> stats = {"count": 4, "histogram": {"exponent_lo": -30, "counts": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]}}
    >>> scaled_underflow_share(stats, 0), scaled_underflow_share(stats, 1), scaled_underflow_share(stats, 6)
    (0.5, 0.25, 0.0)
    """
    if not stats or scale_log2 is None or not stats.get("count"):
        return None
    hist = stats.get("histogram") or {}
    lo, counts = hist.get("exponent_lo", 0), hist.get("counts") or []
    lowest = FP16.exponent_range[0]
    flushed = sum(c for i, c in enumerate(counts) if lo + i + scale_log2 < lowest)
    return flushed / stats["count"]


def _get(stats: dict[str, Any] | None, key: str) -> float | None:
    return None if not stats else stats.get(key)


def _overflow(module: dict[str, Any]) -> float | None:
    shares = [_get(module.get(kind), "fp16_overflow_share") for kind in ("inputs", "outputs")]
    present = [s for s in shares if not is_missing(s)]
    return max(present) if present else None


def _recommended(data: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in data.get("comparisons") or [] if c.get("label") == "recommended"), None)


def _comparison_cells(module: dict[str, Any], comparison: dict[str, Any] | None) -> list[str]:
    entry = ((comparison or {}).get("modules") or {}).get(module.get("name", ""))
    if not entry:
        return [MISSING, MISSING]
    if entry.get("nonfinite"):
        return ["non-finite", "non-finite"]
    return [fmt_cosine(entry.get("cosine")), fmt_error(entry.get("rel_error"))]


def _scale_tag(k: int | None) -> str:
    return "scaled" if k is None else f"2^{k}"


def _headers(k: int | None) -> list[str]:
    """Column headers, broken where the terminal table wraps them (report.md joins the lines)."""
    return [
        "Module", "Type", "Grad underflow\nfp16", f"Grad underflow\nfp16 @ {_scale_tag(k)}", "Act. overflow\nfp16",
        "Grad rel. error\nfp16 / bf16", "Grad range\n(bits)", "Grad cosine\n(recommended)", "Grad error\n(recommended)",
        "Problems", "Watch",
    ]  # fmt: skip


_SCALE_FIXES = "(the loss scale fixes it)"
"""How severity.py ends a finding the recommended fp16 loss scale takes care of."""


def split_problems(module: dict[str, Any], recommended_precision: str | None) -> tuple[list[str], list[str]]:
    """A module's findings as (problems, watch): problems are what the recommendation acts on (the module is kept
    in fp32, or an fp16 policy's loss scale fixes it); the rest it prescribes nothing for, so they are only to
    watch: worth knowing (they matter under another policy), not a call to act.

    >>> m = {"keep_fp32": False, "problems": ["grads: 3% below 2^-24 unscaled (the loss scale fixes it)", "x"]}
    >>> split_problems(m, "16-mixed"), split_problems(m, "bf16-mixed")[0]
    ((['grads: 3% below 2^-24 unscaled (the loss scale fixes it)'], ['x']), [])
    """
    found = list(module.get("problems") or [])
    if module.get("keep_fp32"):
        return found, []
    scaled = str(recommended_precision or "").startswith("16")  # only fp16 policies carry the loss scale
    fixed = [p for p in found if scaled and p.endswith(_SCALE_FIXES)]
    return fixed, [p for p in found if p not in fixed]


def module_rows(data: dict[str, Any], top: int | None = TOP) -> TableRows:
    """The module table as plain strings, worst first, at most ``top`` rows (all of them when None).

    >>> rows = module_rows({"loss_scale_log2": 10, "modules": [{"name": "", "type": "Net", "severity": 0.0}]})
    >>> rows.headers[:4], rows.rows[0][:2]
    (['Module', 'Type', 'Grad underflow fp16', 'Grad underflow fp16 @ 2^10'], ['(model)', 'Net'])
    """
    k, precision = data.get("loss_scale_log2"), data.get("recommended_precision")
    recommended = _recommended(data)
    rows = []
    modules = ranked_modules(data)
    for module in modules if top is None else modules[:top]:
        grads, bits = module.get("grads"), _get(module.get("grads"), "range_bits")
        rows.append([
            module_label(module.get("name")), module.get("type") or MISSING,
            fmt_share(_get(grads, "fp16_underflow_share")), fmt_share(scaled_underflow_share(grads, k)),
            fmt_share(_overflow(module)),
            f"{fmt_error(_get(grads, 'fp16_rel_error'))} / {fmt_error(_get(grads, 'bf16_rel_error'))}",
            MISSING if is_missing(bits) else f"{bits:.1f}",
            *_comparison_cells(module, recommended), *("; ".join(f) for f in split_problems(module, precision)),
        ])  # fmt: skip
    headers = [h.replace("\n", " ") for h in _headers(k)]
    return TableRows(headers=headers, rows=rows, justify=["left", "left"] + ["right"] * 7 + ["left", "left"])


# Left out first when the terminal is too narrow for every column, so the cells left are whole, not "Grad r…".
# Watch goes first: it asks nothing of the user, and report.md and doctor.json keep it.
_DROP_ORDER = ("Watch", "Grad error", "Grad range", "Grad rel. error", "Type", "Act. overflow", "Grad cosine")
_PROBLEMS_MIN = 24
"""Narrowest the problems and watch columns may wrap to before another column is left out instead."""


def _fitting_columns(headers: list[str], rows: list[list[str]], width: int | None) -> list[int]:
    """Indices of the columns to show: all of them if they fit ``width``, else without the least needed."""
    needed = column_widths(headers, rows)
    needed[-2:] = [min(n, _PROBLEMS_MIN) for n in needed[-2:]]  # problems and watch: prose wraps
    kept = list(range(len(headers)))
    for drop in _DROP_ORDER:
        if width is None or table_width([needed[i] for i in kept]) <= width:
            break
        kept = [i for i in kept if not headers[i].startswith(drop)]
    return kept


def build_table(data: dict[str, Any], top: int | None = TOP, width: int | None = None) -> Table:
    """The rich table of :func:`module_rows`; modules the recommendation keeps in fp32 are bold.

    With ``width`` (the console's), columns that do not fit are left out, least needed first, and the caption
    says so: a table squeezed by rich would cut every figure short instead.
    """
    rows = module_rows(data, top)
    headers = _headers(data.get("loss_scale_log2"))
    kept = _fitting_columns(headers, rows.rows, width)
    caption = "bold: kept in fp32"
    if len(kept) < len(headers):
        dropped = len(headers) - len(kept)
        caption += f"; {dropped} column{'s' if dropped > 1 else ''} left out to fit the terminal (widen it to see them)"
    table = Table(header_style="bold", caption=caption, caption_justify="left")
    for i in kept:
        wraps = headers[i] in ("Module", "Problems", "Watch")  # names and prose may wrap; figures keep to one line
        table.add_column(headers[i], justify=rows.justify[i], no_wrap=not wraps)  # type: ignore[arg-type]
    kept_fp32 = {m.get("name") for m in data.get("modules") or [] if m.get("keep_fp32")}
    for module, cells in zip(ranked_modules(data), rows.rows):
        table.add_row(*(Text(cells[i]) for i in kept), style="bold" if module.get("name") in kept_fp32 else None)
    return table
