"""The fp8 layer plan as a table: in the terminal (``ampkit memory``, ``ampkit bench``) and in report.md.

One row per group of layers that differ only by a block index, with the roofline's bf16 and fp8 times of one
layer's forward and backward, the predicted speed-up and the policy's decision; then the Linear layers' total.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.memory._fp8_layers import fp8_layer_plan
    >>> plan = fp8_layer_plan(nn.Sequential(nn.Linear(4096, 4096), nn.Linear(4096, 10)), (torch.zeros(8192, 4096, device="meta"), None))
    >>> print(fp8_markdown(plan).splitlines()[2])
    | 0 | 1 | 8192 x 4096 -> 4096 | 893.6 | 737.2 | 320.5 | 1.21x | fp8 |
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..memory._fp8_layers import Fp8Plan, group_layers
from ..policy._fp8_matmuls import CONV1D, conv1d_note

__all__ = ["HEADERS", "fp8_markdown", "fp8_rows", "fp8_summary", "print_fp8_table"]

HEADERS = ("layers", "n", "rows x in -> out", "bf16 µs", "fp8 µs", "of it casts", "speed-up", "runs in")


def fp8_rows(plan: Fp8Plan) -> list[tuple[str, ...]]:
    """One row of strings per layer group, under :data:`HEADERS`."""
    rows = []
    for g in group_layers(plan):
        c = g.first.cost
        runs_in = "fp8" if g.first.convert else "bf16"
        decision = runs_in if g.first.by_roofline else f"{runs_in}: {g.first.reason}"
        label = g.first.name if g.count == 1 else g.pattern
        label += f" ({g.first.kind})" if g.first.kind != "Linear" else ""  # torchao does not convert it: say what it is
        rows.append((label, str(g.count), f"{c.tokens} x {c.in_features} -> {c.out_features}", f"{c.bf16_s * 1e6:,.1f}",
                     f"{c.fp8_s * 1e6:,.1f}", f"{c.fp8_cast_s * 1e6:,.1f}", f"{c.speedup:.2f}x", decision))
    return rows


def fp8_summary(plan: Fp8Plan) -> str:
    """One sentence: how many layers run in fp8 and the predicted speed-up of the Linear layers' time."""
    converted = sum(p.convert for p in plan.layers)
    conv1d = conv1d_note(sum(p.kind == CONV1D for p in plan.layers), len(plan.layers))
    return (
        f"{plan.policy} on {plan.gpu}, {plan.tokens} rows per micro-batch: {converted} of {len(plan.layers)} Linear layers in fp8; "
        f"their forward and backward {plan.linear_bf16_s * 1e6:,.1f} µs in bf16 -> {plan.linear_planned_s * 1e6:,.1f} µs "
        f"({plan.speedup:.2f}x predicted). A roofline: peak FLOP/s and bandwidth, fp8 casts as torchao runs them, "
        "no launch overheads (torch.compile assumed); the rest of the step is unchanged."
    ) + (f" {conv1d}" if conv1d else "")


def fp8_markdown(plan: Fp8Plan) -> str:
    """The table and its summary as markdown (report.md)."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in fp8_rows(plan)]
    return "\n".join(lines) + "\n\n" + fp8_summary(plan) + "\n"


def print_fp8_table(plan: Fp8Plan, console: Console) -> None:
    """Print the plan's table and summary to ``console``."""
    console.print(f"[bold]fp8 layers[/bold] ({plan.policy}, predicted for {plan.gpu})")
    table = Table(show_edge=False)
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("layers", "runs in") else "right", no_wrap=h != "runs in")
    for row in fp8_rows(plan):
        table.add_row(*row)
    console.print(table)
    console.print(f"[dim]{fp8_summary(plan)}[/dim]")
