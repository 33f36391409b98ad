"""The terminal view of a doctor result: what ran, the modules worst first, the recommendation, the comparisons.

Everything here reads the plain dict written as doctor.json, so a saved result renders exactly like a fresh one.
The module columns and summary lines are defined once, in :mod:`~ampkit.numerics._module_table` (:func:`module_rows`)
and :mod:`~ampkit.numerics._result_lines` (:func:`recommendation_lines`, :func:`comparison_lines`, ...), and reused by
report.md, so the terminal and the report never disagree; this module puts them on the console, and its names stay
importable from here.

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
from rich.text import Text

from .._util.units import fmt_share
from ._cells import fmt_cosine, fmt_error, module_label
from ._fp8_table import render_headroom
from ._module_table import TOP, build_table, module_rows, ranked_modules, scaled_underflow_share, split_problems
from ._result_lines import (
    comparison_lines,
    comparison_summary,
    compile_lines,
    header_lines,
    loss_scale_line,
    recommendation_lines,
    update_lines,
)

__all__ = [
    "TOP", "build_table", "comparison_lines", "comparison_summary", "compile_lines", "fmt_cosine", "fmt_error", "fmt_share",
    "header_lines", "loss_scale_line", "module_label", "module_rows", "ranked_modules", "recommendation_lines", "render",
    "scaled_underflow_share", "split_problems", "update_lines",
]  # fmt: skip

log = logging.getLogger("ampkit")


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
