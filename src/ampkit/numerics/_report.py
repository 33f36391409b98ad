"""report.md: a doctor result as a Markdown page to read on its own, or paste into an issue or a PR.

It says what ran, what the doctor recommends and why (the Engine line to paste, after the lines of its own script
for a model from Lightning or Hugging Face; the loss scale, the modules kept in fp32), how the default and the
recommended policy compared with the fp32 reference, the module table worst first, the pictures, and how to read
the thresholds. The module columns and summary sentences are those of the
terminal (:mod:`ampkit.numerics._module_table`, :mod:`ampkit.numerics._result_lines`), so the two never disagree.

    >>> import tempfile
    >>> data = {"workload": {"name": "toy"}, "command": "ampkit doctor toy",
    ...         "engine_code": 'Engine(precision="bf16-mixed")', "modules": []}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     text = write_report(data, tmp).read_text()
    >>> text.splitlines()[0], '```python\\nEngine(precision="bf16-mixed")\\n```' in text
    ('# ampkit doctor: toy', True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._report.dialect import FRAMEWORKS
from .._report.markdown import (
    code_block,
    markdown_table,
    md_escape,
    plot_section,
    write_markdown,
)
from .._util.units import MISSING, fmt_float, fmt_share
from ._cells import fmt_cosine, fmt_error, module_label
from ._formats import FP16
from ._fp8_table import headroom_rows, headroom_summary
from ._module_table import module_rows
from ._result_lines import comparison_summary, compile_lines, header_lines, loss_scale_line, update_lines

__all__ = ["LOWEST_COSINES", "REPORT_NAME", "REPORT_TOP", "md_escape", "render_report", "write_report"]

REPORT_NAME = "report.md"
REPORT_TOP = 30
"""Modules in the report's table; the rest are in doctor.json."""
LOWEST_COSINES = 10
"""Modules listed per comparison, those whose output strayed furthest from the fp32 reference."""

_LOW, _NORMAL, _HIGH = FP16.exponent_range[0], FP16.normal_exponent, FP16.exponent_range[1] + 1
HOW_TO_READ = f"""\
- **fp16** holds magnitudes from 2^{_LOW} (about 6e-8) to {FP16.max:g}. Below 2^{_LOW} a value flushes to zero:
  a gradient there is lost, not just rounded. From 2^{_LOW} to 2^{_NORMAL} (about 6.1e-5) values are
  *subnormal* and keep fewer significant bits the smaller they are. Above {FP16.max:g} a value overflows to inf,
  and one inf in the forward pass makes the loss, and every gradient after it, non-finite.
- **bf16** has fp32's exponent range (down to 2^-133 with subnormals, up to about 3.4e38), so it neither flushes
  nor overflows where fp32 would not; it has 8 bits of precision instead of fp32's 24, so every value is rounded
  by up to 2^-8 (about 0.4%) of itself.
- **The loss scale** multiplies the loss, and so every gradient, by 2^k before backward: each gradient's binary
  exponent moves up by exactly k, lifting small gradients out of fp16's flush-to-zero range. The optimizer
  divides it out again. The recommended k is the largest that keeps the largest gradient at or below {FP16.max:g}.
- **Grad underflow** is the share of a module's weight gradients that flush to zero in fp16, unscaled and at the
  recommended scale; **act. overflow** the share of its inputs or outputs above {FP16.max:g}; **grad rel. error**
  the relative rounding error ‖g - cast(g)‖ / ‖g‖ of a cast to fp16 and to bf16; **grad range** log2(max|g| /
  min|g|), the binades the gradients span (fp16 covers 40, of which 30 normal).
- **Grad cosine** and **grad error** compare the gradient of a module's own parameters after one step under the
  recommended policy with the fp32 gradient on the same weights and batch: cosine similarity, and
  ‖g - g_fp32‖ / ‖g_fp32‖. A module *diverges* when its gradient is non-finite, lost (all zero), or off by more
  than the sampling noise SGD lives with anyway (the **noise**: how far the fp32 gradients of the two halves
  of the batch differ).
- **fp8 headroom** casts each Linear's input, weight and output gradient of one fp32 step to fp8 as torchao's
  float8 recipe would (dynamic scale fp8_max / amax, so the largest value always fits) and measures what the
  small values lose: the share of nonzero values **flushed** to zero, and the **error** ‖dequant(cast(x)) - x‖ /
  ‖x‖. A layer is flagged when more than 1% flush, when the error passes the format's unit roundoff (2^-4 for
  e4m3, 2^-3 for e5m2: rounding alone stays below it, only values pushed out of fp8's normal range go beyond),
  or when an amax is inf or NaN (the scale breaks).
"""

def _table(headers: list[str], rows: list[list[str]], justify: list[str]) -> list[str]:
    return markdown_table(headers, rows, justify, escape=md_escape)  # module names hold '_' and '*': escape them


def _what_ran(data: dict[str, Any]) -> list[str]:
    title, *rest = header_lines(data)
    facts = [f"**Device:** {md_escape(data.get('device') or 'unknown')}"]
    facts += [f"{key} {md_escape(data[key])}" for key in ("torch", "ampkit") if data.get(key)]
    facts += [f"date {md_escape(data['created'])}"] if data.get("created") else []
    facts += [f"**reference:** {data['reference_steps']} fp32 steps"] if data.get("reference_steps") is not None else []
    description = [md_escape(line) for line in rest[:-1]]  # header_lines ends with the facts line, redone here
    lines = [f"# {md_escape(title)}", "", *description, *([""] if description else []), " · ".join(facts), ""]
    if data.get("command"):
        lines += ["Command:", "", *code_block(str(data["command"]), "sh"), ""]
    return lines


def _kept_reasons(data: dict[str, Any]) -> list[str]:
    modules = {m.get("name"): m for m in data.get("modules") or []}
    lines = []
    for name in data.get("keep_fp32") or []:
        module = modules.get(name) or {}
        why = "; ".join(module.get("problems") or []) or "no single problem recorded; kept by the doctor's search"
        kind = f" ({md_escape(module['type'])})" if module.get("type") else ""
        lines.append(f"- **{md_escape(module_label(name))}**{kind}: {md_escape(why)}")
    return lines or ["Nothing needs to stay in fp32."]


def _underflow_table(data: dict[str, Any]) -> list[str]:
    split, k = data.get("gradient_underflow") or {}, data.get("loss_scale_log2")
    if not split or k is None:
        return []
    rows = [[f"{kind[:-1]} gradients", fmt_share(v.get("unscaled")), fmt_share(v.get("scaled"))]
            for kind, v in split.items()]  # fmt: skip
    return _table(["Gradients", f"below 2^{_LOW} unscaled", f"below 2^{_LOW} at 2^{k}"], rows, ["left", "right", "right"]) + [""]


def _recommendation(data: dict[str, Any]) -> list[str]:
    precision, target = data.get("recommended_precision") or MISSING, data.get("target")
    chosen = f" (tailored for `{target}`)" if target else " (chosen by the doctor)"
    lines = ["## Recommendation", "", f"**Precision: `{precision}`**{chosen}", ""]
    reasons = data.get("precision_reasons") or []
    lines += [f"- {md_escape(r)}" for r in reasons] + ([""] if reasons else [])
    notes = data.get("tailoring_notes") or []  # written by the doctor when it had to bend the advice to the target
    lines += [f"> {md_escape(n)}" for n in notes] + ([""] if notes else [])
    framework = FRAMEWORKS.get(data.get("framework") or "")
    if framework and data.get("framework_code"):  # the user's own framework first; the Engine line for a plain loop
        lines += [f"Paste into your {framework} script:", "", *code_block(str(data["framework_code"]), "python"), ""]
        if data.get("engine_code"):
            lines += ["Or, in a plain PyTorch loop:", "", *code_block(str(data["engine_code"]), "python"), ""]
    elif data.get("engine_code"):
        lines += ["Paste into your training script:", "", *code_block(str(data["engine_code"]), "python"), ""]
    scale = loss_scale_line(data)
    if scale:
        needed = str(precision).startswith("16")
        note = "" if needed else f" `{precision}` needs no loss scale (bf16 has fp32's range); this is for fp16."
        lines += [f"**{md_escape(scale)}**{note}", "", *_underflow_table(data)]
    return lines + ["**Kept in fp32:**", "", *_kept_reasons(data), ""]


def _cosine_rank(item: tuple[str, dict[str, Any]]) -> tuple[int, float]:
    entry = item[1]
    if entry.get("nonfinite"):
        return 0, 0.0  # worst of all: no cosine to compare
    cosine = entry.get("cosine")
    return (2, 0.0) if cosine is None else (1, float(cosine))


def _comparisons(data: dict[str, Any]) -> list[str]:
    comparisons = data.get("comparisons") or []
    if not comparisons:
        return ["## Comparisons", "", "No comparison with the fp32 reference was run.", ""]
    lines = ["## Comparisons", "", "Each policy ran on the same weights and batches as the fp32 reference.", ""]
    for comp in comparisons:
        lines += [f"### {md_escape(comp.get('label', '?'))}: `{comp.get('policy') or MISSING}`", ""]
        kept = [module_label(n) for n in comp.get("keep_fp32") or []]
        lines += [f"- {md_escape(comparison_summary(comp))}"]
        lines += [f"- modules in fp32: {md_escape(', '.join(kept)) if kept else 'none'}"]
        lines += [f"- loss scale: {fmt_float(comp.get('loss_scale'), 8)}", ""] if comp.get("loss_scale") else [""]
        entries = sorted((comp.get("modules") or {}).items(), key=_cosine_rank)[:LOWEST_COSINES]
        if entries:
            noise = any(e.get("noise") is not None for _, e in entries)  # None without a batch to split in halves
            rows = [[module_label(name), "non-finite" if e.get("nonfinite") else fmt_cosine(e.get("cosine")),
                     fmt_error(e.get("rel_error")), *([fmt_error(e.get("noise"))] if noise else []),
                     "yes" if e.get("diverges") else "no"] for name, e in entries]  # fmt: skip
            headers = ["Module", "Cosine", "Rel. error", *(["Noise"] if noise else []), "Diverges"]
            lines += [f"Lowest gradient cosine against fp32 ({len(entries)} of {len(comp['modules'])} modules):", ""]
            lines += _table(headers, rows, ["left"] + ["right"] * (len(headers) - 2) + ["left"]) + [""]
    return lines


def _excess(item: tuple[str, dict[str, Any]]) -> float:
    entry = item[1]
    if entry.get("nonfinite") or entry.get("rel_error") is None:
        return float("-inf") if entry.get("nonfinite") else 0.0
    return -float(entry["rel_error"]) / float(entry.get("limit") or 1.0)


def _compiled(data: dict[str, Any]) -> list[str]:
    check = data.get("compile_check")
    if not check:
        return []
    verdict, *advice = compile_lines(check)
    regions = ", ".join(module_label(r) for r in check.get("compiled") or []) or "nothing"
    lines = ["## Compiled against eager", "", (f"`{check.get('policy') or MISSING}` ran one step eager and one with "
             f"`{md_escape(check.get('compile') or MISSING)}` (compiled: {md_escape(regions)}), same weights, batch and dropout masks."), ""]
    lines += [f"**{md_escape(verdict)}**", "", *(f"- {md_escape(a)}" for a in advice), *([""] if advice else [])]
    lines += [f"- loss: compiled {fmt_float(check.get('loss'))}, eager {fmt_float(check.get('eager_loss'))}, fp32 {fmt_float(check.get('reference_loss'))}"]
    lines += [f"- output dtypes: compiled {', '.join(check.get('output_dtypes') or []) or MISSING}, eager {', '.join(check.get('eager_output_dtypes') or []) or MISSING}", ""]
    entries = sorted((check.get("modules") or {}).items(), key=_excess)[:LOWEST_COSINES]
    if entries:
        rows = [[module_label(name), "non-finite" if e.get("nonfinite") else fmt_error(e.get("rel_error")), fmt_error(e.get("limit")),
                 "yes" if e.get("diverges") else "no"] for name, e in entries]  # fmt: skip
        lines += [(f"Gradient difference from eager, largest against its limit first ({len(entries)} of {len(check['modules'])} "
                   "modules); the limit is the policy's own error against fp32:"), ""]  # fmt: skip
        lines += _table(["Module", "Rel. error vs eager", "Limit", "Diverges"], rows, ["left", "right", "right", "left"]) + [""]
    return lines


def _updates(data: dict[str, Any]) -> list[str]:
    check = data.get("update_precision")
    if not check:
        return []
    lines = ["## Update precision", "", (
        f"`{check.get('policy')}` (bf16 weights stepped directly) trained {check.get('steps')} steps from the same weights and batches "
        f"as `32-true`, each step's update audited against the update the optimizer computed in fp32. A policy recovers fp32's "
        f"trajectory when its held-out loss falls by at least {fmt_share(check.get('recovered_share'))} of fp32's decrease; "
        "that judges only where fp32's own fall exceeds its noise (half the difference of its falls on the held-out "
        "batch's two halves)."
    ), ""]
    return lines + [f"- {md_escape(line.strip())}" for line in update_lines(check, top=REPORT_TOP)] + [""]


def _fp8(data: dict[str, Any]) -> list[str]:
    fp8 = data.get("fp8_headroom")
    if not fp8:
        return []
    lines = ["## fp8 headroom", "", md_escape(headroom_summary(fp8)) + ".", ""]
    layers = fp8.get("layers") or []
    if not layers:
        return lines
    rows = headroom_rows(fp8, REPORT_TOP)
    shown = f"the worst {len(rows.rows)} of {len(layers)}" if len(layers) > len(rows.rows) else f"all {len(layers)}"
    lines += [f"One fp32 step, each operand cast as torchao's `{fp8.get('recipe')}` recipe casts it (worst first, {shown}):", ""]
    return lines + _table(rows.headers, rows.rows, rows.justify) + [""]


def _modules(data: dict[str, Any]) -> list[str]:
    total = len(data.get("modules") or [])
    if not total:
        return ["## Modules", "", "No module statistics were recorded.", ""]
    rows = module_rows(data, REPORT_TOP)
    shown = f"the worst {len(rows.rows)} of {total}" if total > len(rows.rows) else f"all {total}"
    lines = ["## Modules", "", f"Worst first ({shown}); every figure is from the fp32 reference run.", ""]
    lines += _table(rows.headers, rows.rows, rows.justify) + [""]
    return lines + ([f"... {total - len(rows.rows)} more in doctor.json", ""] if total > len(rows.rows) else [])


def render_report(data: dict[str, Any], out_dir: str | os.PathLike[str] = ".", plots: list[Path] | None = None) -> str:
    """The text of report.md for the doctor result ``data``; plot links are relative to ``out_dir``.

    ``plots`` are paths as :func:`ampkit.numerics._plots.write_plots` returns them, absolute or relative to the
    current directory (see :func:`ampkit._report.markdown.plot_links`).
    """
    out = Path(out_dir)
    lines = _what_ran(data) + _recommendation(data) + _comparisons(data) + _updates(data) + _compiled(data) + _fp8(data) + _modules(data) + plot_section(out, plots, escape=md_escape)
    return "\n".join(lines + ["## How to read this", "", HOW_TO_READ])


def write_report(data: dict[str, Any], out_dir: str | os.PathLike[str], plots: list[Path] | None = None) -> Path:
    """Write ``out_dir/report.md`` (the directory is created) and return its path.

    ``plots`` are the PNGs to embed (from :func:`ampkit.numerics._plots.write_plots`); missing ones are skipped
    with a warning rather than left as broken links.
    """
    out = Path(out_dir)
    return write_markdown(out / REPORT_NAME, render_report(data, out, plots))
