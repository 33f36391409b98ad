"""The terminal view of a doctor result: what ran, the modules worst first, the recommendation, the comparisons.

Everything here reads the plain dict written as doctor.json, so a saved result renders exactly like a fresh one.
The module columns and summary lines are defined once (:func:`module_rows`, :func:`recommendation_lines`,
:func:`comparison_lines`) and reused by report.md, so the terminal and the report never disagree.

    >>> import io
    >>> from rich.console import Console
    >>> data = {"workload": {"name": "toy"}, "recommended_precision": "bf16-mixed",
    ...         "modules": [{"name": "fc", "type": "Linear", "severity": 1.0, "problems": ["grads underflow"]}]}
    >>> console = Console(file=io.StringIO(), width=200)
    >>> render(data, console)
    >>> text = console.file.getvalue()
    >>> "ampkit doctor: toy" in text, "grads underflow" in text, "bf16-mixed" in text
    (True, True, True)
"""

from __future__ import annotations

import logging
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from .._report.dialect import FRAMEWORKS
from .._report.tables import TableRows, column_widths, table_width
from .._util.units import MISSING, fmt_float, fmt_share, is_missing
from ._cells import fmt_cosine, fmt_error, module_label
from ._engine_code import engine_code
from ._formats import FP16
from ._fp8_table import render_headroom

__all__ = [
    "TOP", "build_table", "comparison_lines", "comparison_summary", "compile_lines", "fmt_cosine", "fmt_error", "fmt_share",
    "header_lines", "loss_scale_line", "module_label", "module_rows", "ranked_modules", "recommendation_lines", "render",
    "scaled_underflow_share", "split_problems", "update_lines",
]  # fmt: skip

log = logging.getLogger("ampkit")

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


def header_lines(data: dict[str, Any]) -> list[str]:
    """What ran: workload (and size), its description, device, torch and how many fp32 reference steps."""
    workload = data.get("workload") or {}
    title = f"ampkit doctor: {workload['name']}" if workload.get("name") else "ampkit doctor"  # diagnose() names none
    if workload.get("size"):
        title += f" (size {workload['size']})"
    lines = [title]
    if workload.get("description"):
        lines.append(str(workload["description"]))
    facts = [f"device {data.get('device') or 'unknown'}"]
    facts += [f"torch {data['torch']}"] if data.get("torch") else []
    steps = data.get("reference_steps")
    facts += [f"{steps} fp32 reference step{'s' if steps != 1 else ''}"] if steps is not None else []
    lines.append(" · ".join(facts))
    return lines


def _scale_value(scale: float) -> str:
    # Whole up to seven digits (8192, 131072); beyond, 1.07e+09 reads better than 1073741824.
    return f"{scale:.0f}" if 1 <= scale < 1e7 else f"{scale:.3g}"


def loss_scale_line(data: dict[str, Any]) -> str | None:
    """The recommended fp16 loss scale and why, as the classic underflow finding; None when there is none.

    >>> loss_scale_line({"recommended_loss_scale": 1024.0, "loss_scale_log2": 10,
    ...                  "underflow_share_unscaled": 0.031, "underflow_share_scaled": 2e-6})
    'Loss scale 2^10 (1024): 3.1% of gradient values below 2^-24 unscaled, <0.01% at 2^10.'
    """
    k, scale = data.get("loss_scale_log2"), data.get("recommended_loss_scale")
    if k is None or is_missing(scale):
        return None
    lowest = FP16.exponent_range[0]
    unscaled, scaled = data.get("underflow_share_unscaled"), data.get("underflow_share_scaled")
    return (
        f"Loss scale 2^{k} ({_scale_value(scale)}): {fmt_share(unscaled)} of gradient values below "
        f"2^{lowest} unscaled, {fmt_share(scaled)} at 2^{k}."
    )


def recommendation_lines(data: dict[str, Any]) -> list[str]:
    """The recommendation in words: precision and reasons, loss scale, modules kept in fp32, the Engine line; for a
    model from a framework (doctor.json's ``framework``), its script's lines first (``framework_code``)."""
    precision = data.get("recommended_precision") or MISSING
    target = data.get("target")
    lines = [f"Recommended precision: {precision}" + (f" (tailored for {target})" if target else "")]
    lines += [f"  - {reason}" for reason in data.get("precision_reasons") or []]
    scale = loss_scale_line(data)
    if scale:
        # The scale is measured either way; say when the chosen policy does not need it (bf16 keeps fp32's range).
        needed = str(precision).startswith("16")
        lines.append(scale + ("" if needed else " (only fp16 needs a loss scale)"))
    kept = [module_label(name) for name in data.get("keep_fp32") or []]
    lines.append(f"Keep in fp32: {', '.join(kept) if kept else 'nothing'}")
    framework = FRAMEWORKS.get(data.get("framework") or "")
    if framework and data.get("framework_code"):  # the user's own framework first; the Engine line for a plain loop
        lines += [f"Paste into your {framework} script:", *str(data["framework_code"]).splitlines()]
        if data.get("engine_code"):
            lines.append(f"Or, in a plain PyTorch loop: {data['engine_code']}")
    elif data.get("engine_code"):
        lines.append(f"Paste: {data['engine_code']}")
    return lines


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(module_label(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def comparison_summary(comp: dict[str, Any]) -> str:
    """Whether a comparison run stayed finite (with its loss) or where it first broke, and what diverged.

    >>> comparison_summary({"finite": False, "forward_origin": "fc2", "diverging": ["fc2", "fc3"]})
    'non-finite, first in the forward pass at fc2; 2 modules diverge: fc2, fc3'
    """
    if comp.get("finite", True):
        state = "finite"
        if not is_missing(comp.get("loss")):
            state += f", loss {fmt_float(comp['loss'])} vs fp32 {fmt_float(comp.get('reference_loss'))}"
    else:
        phases = (("forward", "forward_origin"), ("backward", "backward_origin"))
        where = [f"the {phase} pass at {module_label(comp[key])}" for phase, key in phases if comp.get(key) is not None]
        state = "non-finite, first in " + " and ".join(where) if where else "non-finite (origin not found)"
    diverging = comp.get("diverging") or []
    count = f"{len(diverging)} modules diverge" if len(diverging) != 1 else "1 module diverges"
    return f"{state}; {count}" + (f": {_names(diverging)}" if diverging else "")


def comparison_lines(data: dict[str, Any]) -> list[str]:
    """One line per comparison run: label and policy, then :func:`comparison_summary`."""
    return [f"{c.get('label', '?')} ({c.get('policy') or MISSING}): {comparison_summary(c)}" for c in data.get("comparisons") or []]


def compile_lines(check: dict[str, Any]) -> list[str]:
    """The compiled-against-eager check (doctor.json's ``compile_check``): its verdict, then what to do.

    >>> compile_lines({"verdict": "compiled step diverges from eager under bf16-mixed: fc off", "advice": ["keep fc eager"]})
    ['compiled step diverges from eager under bf16-mixed: fc off', 'what to do: keep fc eager']
    """
    return [str(check.get("verdict") or MISSING)] + [f"what to do: {a}" for a in check.get("advice") or []]


def update_lines(data: dict[str, Any], top: int = 5) -> list[str]:
    """The update-precision check (doctor.json's ``update_precision``, see :mod:`ampkit.numerics._update_remedy`) as
    lines for the terminal and report.md: the verdict, the worst parameters, each remedy tried, the prescription.

    >>> update_lines({"steps": 4, "lost": False, "initial_loss": 1.0, "fp32_loss": 0.5, "params": {}, "trials": []})
    ['bf16-true keeps its updates over 4 steps (held-out loss 1 -> 0.5 in fp32)']
    """
    head = f"over {data['steps']} steps (held-out loss {data['initial_loss']:.4g} -> {data['fp32_loss']:.4g} in fp32)"
    policy = data.get("policy") or "bf16-true"
    judged = data.get("judged", True)
    if not data.get("lost") and judged:
        return [f"{policy} keeps its updates {head}"]
    lines = [f"{policy} {'loses updates' if data.get('lost') else 'keeps its updates, by the audit,'} {head}"]
    ranked = sorted(data.get("params", {}).items(), key=lambda kv: (-kv[1]["lost_share"], -kv[1]["discarded_share"]))
    for name, p in ranked[:top]:
        decay = f", decay {fmt_share(p['decay_lost_share'])} lost" if p.get("decay_lost_share") is not None else ""
        lines.append(f"  {name or '(model)'}: {fmt_share(p['lost_share'])} lost, {fmt_share(p['discarded_share'])} discarded{decay}")
    for t in data.get("trials", []):
        cost = f" (+{t['bytes_per_param']:.3g} B/param)" if t.get("bytes_per_param") is not None else ""
        verdict = f", {'recovers' if t['recovered'] else 'does not recover'} fp32's decrease" if judged else ""
        lines.append(f"  {t['policy']}{cost}: held-out loss {t['loss']:.4g}{verdict}")
    if not judged:
        lines.append(_unjudged_line(data))
        return lines
    for name, why in (data.get("skipped") or {}).items():
        lines.append(f"  {name}: not tried: {why}")
    lines.append(_update_prescription(data))
    return lines


def _update_prescription(data: dict[str, Any]) -> str:
    """The check's last line. The doctor prints one recommendation (the ``Paste:`` line): the check's prescription is
    either part of it (the recommended policy steps bf16 weights) or an option beside it, to hold the weights in bf16
    where the recommendation keeps them in fp32, and the line says which."""
    prescribed = data.get("prescribed")
    if not prescribed:
        return "No remedy tried recovers fp32's decrease: keep fp32 weights (a mixed policy) or train longer to judge"
    code = data.get("engine_code") or engine_code(prescribed, data.get("keep_fp32") or ())
    if data.get("applied"):
        return f"Prescribed, and part of the recommendation above: {code}"
    if data.get("recommendation_fp32_weights", True):
        return f"Only to hold the weights in bf16 (the recommendation above keeps them in fp32): {code}"
    return f"Beside the recommendation above, what recovers {data.get('policy') or 'bf16-true'}'s updates: {code}"


def _unjudged_line(data: dict[str, Any]) -> str:
    """Why an update check whose fp32 reference did not improve judges no remedy, and how to make it judge."""
    fall, noise = data["initial_loss"] - data["fp32_loss"], data.get("fp32_noise")
    factor = data.get("noise_factor", 1.0)
    how = "rose" if fall <= 0 else f"fell by {fall:.2g}, within {'' if factor == 1 else f'{factor:g}x '}its noise ({noise:.2g})"
    return (
        f"fp32's own held-out loss {how} over {data['steps']} steps: with no fall to follow, the check cannot judge any "
        f"remedy, so none was tried. Train it longer: --update-steps {4 * data['steps']} "
        f"(diagnose(update_steps={4 * data['steps']}))"
    )


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


def render(data: dict[str, Any], console: Console, top: int = TOP) -> None:
    """Print the doctor result ``data`` (the doctor.json dict) to ``console``: at most ``top`` modules."""
    title, *rest = header_lines(data)
    console.print(Text(title, style="bold"))
    for line in rest:
        console.print(Text(line))
    modules = data.get("modules") or []
    if modules:
        console.print(build_table(data, top, width=console.width))
        if len(modules) > top:
            console.print(Text(f"... {len(modules) - top} more in doctor.json", style="dim"))
    else:
        log.warning("doctor result for %s has no modules to show", (data.get("workload") or {}).get("name"))
    console.print()
    code = set(str(data.get("framework_code") or "").splitlines())
    for line in recommendation_lines(data):
        # The lines to paste are soft-wrapped: rich puts no newline inside them.
        style = "bold" if line.startswith("Recommended") else ""
        console.print(Text(line, style=style), soft_wrap=line.startswith(("Paste:", "Or, in a plain PyTorch loop:")) or line in code)
    comparisons = data.get("comparisons") or []
    if comparisons:
        console.print()
        console.print(Text("Comparisons against the fp32 reference:", style="bold"))
        for comp, line in zip(comparisons, comparison_lines(data)):
            # Indented as a block, so a wrapped line still reads as part of its comparison.
            console.print(Padding(Text(line, style="" if comp.get("finite", True) else "red"), (0, 0, 0, 2), expand=False))
    updates = data.get("update_precision")
    if updates:
        console.print()
        console.print(Text("Update precision (bf16 weights stepped without fp32 masters):", style="bold"))
        for line in update_lines(updates):
            console.print(Padding(Text(line, style="red" if updates.get("lost") and not updates.get("prescribed") else ""), (0, 0, 0, 2), expand=False))
    fp8 = data.get("fp8_headroom")
    if fp8:
        console.print()
        render_headroom(fp8, console)
    check = data.get("compile_check")
    if check:
        console.print()
        console.print(Text(f"Compiled ({check.get('compile')}) against eager:", style="bold"))
        for line in compile_lines(check):
            console.print(Padding(Text(line, style="" if check.get("agrees") else "red"), (0, 0, 0, 2), expand=False))
