"""``ampkit memory``: what a training step needs per precision policy, predicted without the device.

    ampkit memory                                        # the built-in workload for this device, every policy
    ampkit memory -w gpt --size large --device cuda --batch-size 64
    ampkit memory --model mypkg.nets:build --data mypkg.data:batches --precision 32-true,bf16-mixed --json
    ampkit memory -w gpt --device cuda --device-memory 24GiB   # the largest batch that fits, per policy
    ampkit memory -w gpt --size large --fp8 H100                # which Linear layers pay in fp8 on an H100

Every figure comes from one training step run on fake tensors (:func:`ampkit.memory.estimate`): nothing is
allocated on the device and no GPU is needed. Exit code 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from .._util.units import fmt_bytes
from ..bench._fp8_table import print_fp8_table
from ..memory._estimate import BREAKDOWN, MemoryEstimate, estimate
from ..memory._fit import Fit, largest_batch, resize_batch
from ..memory._fp8_layers import Fp8Plan, fp8_layer_plan, planned_policy
from ..policy import Policy, get_policy, policy_names
from ..policy._fp8 import FP8Policy
from ..workloads import Workload, parse_precisions
from ._console import stdout_console
from ._parsers import (
    add_memory as register,  # declared apart: `ampkit --help` imports none of this module
)
from ._workload_args import device_arg, workload_from_args, workload_size

__all__ = ["register", "run"]

_HEADERS = {"parameters": "params", "gradients": "grads", "optimizer_state": "optim", "master_weights": "masters",
            "activations": "activ."}


def _policies(text: str | None, device: torch.device) -> list[Policy]:
    """``--precision`` made into Policy objects, once; by default every policy (a GPU's prediction needs no GPU
    here) or every one the CPU runs. A policy the CPU cannot run is refused for a CPU prediction."""
    if text is None:
        every = [get_policy(n) for n in policy_names()]
        return every if device.type == "cuda" else [p for p in every if p.support(device).supported]

    def predicted_here(typed: str, policy: Policy) -> None:
        if device.type == "cpu" and not policy.support(device).supported:
            raise ValueError(f"--precision {policy.name} does not run on cpu: {policy.support(device).reason}.")

    return parse_precisions(text, check=predicted_here)


def _example(workload: Workload, batch_size: int | None) -> Any:
    batch = workload.batch(0)
    if workload.channels_last:
        batch = tuple(t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t for t in batch)
    return resize_batch(batch, batch_size) if batch_size is not None else batch


def run(args: argparse.Namespace) -> int:
    """Predict and print the memory of one training step per policy."""
    device = device_arg(args.device, command="memory", predicts=True)
    policies = _policies(args.precision, device)
    budget = args.device_memory
    workload = workload_from_args(args, device, workload_size(args, device), steps=2, warmup=1)
    model = workload.model.to(memory_format=torch.channels_last) if workload.channels_last else workload.model
    batch = _example(workload, args.batch_size)
    options = {"loss_fn": workload.loss_fn, "clip_grad_norm": workload.clip_grad_norm}

    plans = _fp8_plans(args.fp8, policies, model, batch)
    rows: list[tuple[MemoryEstimate, Fit | None]] = []
    for given in policies:
        policy = _planned(given, plans)
        e = estimate(model, batch, workload.optimizer, policy, device, **options)
        fit = largest_batch(model, batch, workload.optimizer, policy, device, budget=budget, **options) if budget else None
        rows.append((e, fit))

    if args.json:
        out = []
        for e, fit in rows:
            entry = e.to_dict()
            if fit is not None:
                entry["device_memory"] = budget
                entry["max_batch_size"] = fit.batch_size
                entry["max_batch_size_is_search_limit"] = fit.limit_reached
            if e.precision in plans:
                entry["fp8_layers"] = plans[e.precision].to_dict()
            out.append(entry)
        print(json.dumps(out, indent=2))
        return 0
    console = stdout_console()  # a log gets every column whole (cli/_console.py)
    _table(rows, workload, device, budget, console)
    for plan in plans.values():
        print_fp8_table(plan, console)
    return 0


def _fp8_plans(gpu: str | None, policies: list[Policy], model: torch.nn.Module, batch: Any) -> dict[str, Fp8Plan]:
    """The layer plan of each fp8 policy measured (or of fp8-tensorwise when only --fp8 asks), at the batch's rows,
    by the policy's name."""
    wanted: list[str | FP8Policy] = [p for p in policies if isinstance(p, FP8Policy)] or (["fp8-tensorwise"] if gpu else [])
    plans = (fp8_layer_plan(model, batch, p, gpu=None if gpu in (None, "auto") else gpu) for p in wanted)
    return {plan.policy: plan for plan in plans}


def _planned(policy: Policy, plans: dict[str, Fp8Plan]) -> Policy:
    """``policy``; an fp8 one set to convert what its plan's table says."""
    return planned_policy(plans[policy.name], policy) if isinstance(policy, FP8Policy) and policy.name in plans else policy


def _table(rows: list[tuple[MemoryEstimate, Fit | None]], workload: Workload, device: torch.device, budget: int | None, console: Console) -> None:
    first = rows[0][0]
    where = f"{device}" + (" (simulated on this CPU: no CUDA here)" if first.simulated_on else "")
    console.print(f"[bold]ampkit memory[/bold]: {workload.name}, batch {first.batch_size}, one training step on {where}")
    if workload.description:
        console.print(f"[dim]{workload.description}[/dim]")
    table = Table(show_edge=False)
    table.add_column("policy", no_wrap=True)
    for header in [*(_HEADERS[k] for k in BREAKDOWN), "total", "peak", "vs fp32"]:
        table.add_column(header, justify="right", no_wrap=True)
    if budget:
        table.add_column("max batch", justify="right", no_wrap=True)
    reference = next((e.peak for e, _ in rows if e.precision == "32-true"), None)
    for e, fit in rows:
        cells = [e.precision, *(fmt_bytes(getattr(e, k)) for k in BREAKDOWN), fmt_bytes(e.total), fmt_bytes(e.peak)]
        cells.append(f"{e.peak / reference:.2f}x" if reference else "-")
        if fit is not None:
            cells.append(("> " if fit.limit_reached else "") + f"{fit.batch_size:,}" if fit.batch_size else "none")
        table.add_row(*cells)
    console.print(table)
    if budget:
        console.print(f"[dim]max batch: the largest batch whose peak fits in {fmt_bytes(budget)}.[/dim]")
    _attention_note(rows, console)
    console.print(
        "[dim]params, grads, optim (optimizer state), masters (fp32 master weights), activ. (activations saved for "
        "backward); total: their sum. "
        "peak: most bytes of live tensors during two steps (batch and temporaries included), comparable with "
        "torch.cuda.max_memory_allocated; leave room for the CUDA context and allocator cache.[/dim]"
    )


def _attention_note(rows: list[tuple[MemoryEstimate, Fit | None]], console: Console) -> None:
    """Say which CUDA attention kernels a simulated prediction modelled, per policy (nothing when none was)."""
    by_kernel: dict[str, list[str]] = {}
    for e, _ in rows:
        if e.attention:
            by_kernel.setdefault(e.attention, []).append(e.precision)
    if not by_kernel:
        return
    which = "; ".join(f"{kernels} for {', '.join(names)}" for kernels, names in by_kernel.items())
    console.print(
        f"[dim]attention: F.scaled_dot_product_attention modelled with the kernels a CUDA GPU (sm80+) picks: {which}. "
        "flash and efficient keep the output and a B x H x T logsumexp for backward, not the B x H x T x T scores the "
        "CPU's kernels keep; math keeps them on a GPU too.[/dim]"
    )
