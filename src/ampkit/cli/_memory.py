"""``ampkit memory``: what a training step needs per precision policy, predicted without the device.

    ampkit memory                                        # the built-in workload for this device, every policy
    ampkit memory -w gpt --size large --device cuda --batch-size 64
    ampkit memory --model mypkg.nets:build --data mypkg.data:batches --precision 32-true,bf16-mixed --json
    ampkit memory -w gpt --device cuda --device-memory 24GiB   # the largest batch that fits, per policy
    ampkit memory -w gpt --size large --fp8 H100                # which Linear layers pay in fp8 on an H100

Every figure comes from one training step run on fake tensors (:func:`ampkit.memory.estimate`): nothing is
allocated on the device and no GPU is needed. A policy whose step cannot run on fake tensors (an op whose fake
kernel refuses its inputs, a shape that depends on values) keeps its row: it is measured on real tensors instead
(:func:`ampkit.memory.measure`) where the device is here, and the row says why; else the row says why it has no
figures. Progress goes to stderr as bench's does (``--no-progress``: none). Exit code 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from .._util.units import fmt_bytes
from ..bench._fp8_table import print_fp8_table
from ..bench._progress import NullReporter, PlainReporter, Reporter, RichReporter
from ..memory._estimate import BREAKDOWN, EstimateError, MemoryEstimate, estimate, measure
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

log = logging.getLogger("ampkit")

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


class _PolicyLines(PlainReporter):
    """bench's plain progress lines (a log, a pipe), counted in policies rather than in a bench's steps."""

    def start(self, total: int) -> None:
        self._total, self._done = total, 0
        self._start = self._last = self._clock()
        self._print(f"progress: {total} policies (one training step each on fake tensors, or measured where it cannot run there)")

    def _line(self, now: float, what: str) -> None:
        self._last = now
        minutes, seconds = divmod(int(now - self._start), 60)
        self._print(f"[{minutes}:{seconds:02d}] {self._done}/{self._total} policies: {what}")


def _reporter(args: argparse.Namespace) -> Reporter:
    if getattr(args, "no_progress", False):
        return NullReporter()
    return RichReporter() if sys.stderr.isatty() else _PolicyLines(sys.stderr)


_Row = tuple[str, MemoryEstimate | None, Fit | None, str | None]
"""A policy's name, its figures (None when neither estimated nor measured), its fit, and why it was not estimated."""


def _measured_instead(
    model: torch.nn.Module, batch: Any, workload: Workload, policy: Policy, device: torch.device, error: EstimateError,
) -> tuple[MemoryEstimate | None, str]:
    """The row of a policy whose step cannot run on fake tensors: measured on real ones where the device is here."""
    why = f"not estimable on fake tensors ({error.reason})"
    if device.type == "cuda" and not torch.cuda.is_available():
        return None, f"{why}; not measured: no CUDA here (run ampkit memory on the GPU to measure it)"
    if any(p.device.type == "meta" for p in model.parameters()):
        return None, f"{why}; not measured: the model is on the meta device (build it with real weights to measure)"
    m = measure(model, batch, workload.optimizer, policy, device, loss_fn=workload.loss_fn, clip_grad_norm=workload.clip_grad_norm)
    note = f"{why}: measured on {device} instead"
    return dataclasses.replace(m, note=note), note


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
    rows: list[_Row] = []
    reporter = _reporter(args)
    reporter.start(len(policies))
    try:
        for given in policies:
            policy = _planned(given, plans)
            reporter.update(f"{policy.name}: {'estimating' + (' the largest batch' if budget else '')}")
            try:
                e: MemoryEstimate | None = estimate(model, batch, workload.optimizer, policy, device, **options)
                fit = largest_batch(model, batch, workload.optimizer, policy, device, budget=budget, **options) if budget else None
                note: str | None = None
            except EstimateError as exc:
                log.info("ampkit memory: %s", exc)
                reporter.update(f"{policy.name}: measuring")
                e, note = _measured_instead(model, batch, workload, policy, device, exc)
                fit = None  # the search estimates: a measured row has no largest batch
                if budget and e is not None:
                    note += "; max batch not searched (the search runs on fake tensors)"
                    e = dataclasses.replace(e, note=note)
            rows.append((given.name, e, fit, note))
            reporter.update(f"{policy.name}: done", advance=1)
    finally:
        reporter.finish()

    if args.json:
        print(json.dumps([_json_entry(name, e, fit, note, budget, plans) for name, e, fit, note in rows], indent=2))
        return 0
    console = stdout_console()  # a log gets every column whole (cli/_console.py)
    _table(rows, workload, device, budget, console)
    for plan in plans.values():
        print_fp8_table(plan, console)
    return 0


def _json_entry(name: str, e: MemoryEstimate | None, fit: Fit | None, note: str | None, budget: int | None, plans: dict[str, Fp8Plan]) -> dict[str, Any]:
    entry: dict[str, Any] = e.to_dict() if e is not None else {"precision": name, "method": None, "note": note}
    if budget:
        entry["device_memory"] = budget
        entry["max_batch_size"] = fit.batch_size if fit is not None else None
        entry["max_batch_size_is_search_limit"] = fit.limit_reached if fit is not None else None
    if name in plans:
        entry["fp8_layers"] = plans[name].to_dict()
    return entry


def _fp8_plans(gpu: str | None, policies: list[Policy], model: torch.nn.Module, batch: Any) -> dict[str, Fp8Plan]:
    """The layer plan of each fp8 policy measured (or of fp8-tensorwise when only --fp8 asks), at the batch's rows,
    by the policy's name."""
    wanted: list[str | FP8Policy] = [p for p in policies if isinstance(p, FP8Policy)] or (["fp8-tensorwise"] if gpu else [])
    plans = (fp8_layer_plan(model, batch, p, gpu=None if gpu in (None, "auto") else gpu) for p in wanted)
    return {plan.policy: plan for plan in plans}


def _planned(policy: Policy, plans: dict[str, Fp8Plan]) -> Policy:
    """``policy``; an fp8 one set to convert what its plan's table says."""
    return planned_policy(plans[policy.name], policy) if isinstance(policy, FP8Policy) and policy.name in plans else policy


def _table(rows: list[_Row], workload: Workload, device: torch.device, budget: int | None, console: Console) -> None:
    first = next((e for _, e, _, _ in rows if e is not None), None)
    simulated = first is not None and first.simulated_on
    where = f"{device}" + (" (simulated on this CPU: no CUDA here)" if simulated else "")
    batch_size = first.batch_size if first is not None else None
    console.print(f"[bold]ampkit memory[/bold]: {workload.name}, batch {batch_size}, one training step on {where}")
    if workload.description:
        console.print(f"[dim]{workload.description}[/dim]")
    table = Table(show_edge=False)
    table.add_column("policy", no_wrap=True)
    for header in [*(_HEADERS[k] for k in BREAKDOWN), "total", "peak", "vs fp32"]:
        table.add_column(header, justify="right", no_wrap=True)
    if budget:
        table.add_column("max batch", justify="right", no_wrap=True)
    reference = next((e.peak for _, e, _, _ in rows if e is not None and e.precision == "32-true"), None)
    for name, e, fit, note in rows:
        mark = "*" if note else ""
        if e is None:
            cells = [name + mark, *["-"] * (len(BREAKDOWN) + 3)]
        else:
            cells = [name + mark, *(fmt_bytes(getattr(e, k)) for k in BREAKDOWN), fmt_bytes(e.total), fmt_bytes(e.peak)]
            cells.append(f"{e.peak / reference:.2f}x" if reference else "-")
        if budget:
            cells.append("-" if fit is None else ("> " if fit.limit_reached else "") + f"{fit.batch_size:,}" if fit.batch_size else "none")
        table.add_row(*cells)
    console.print(table)
    for name, _, _, note in rows:
        if note:
            console.print(f"* {name}: {note}", markup=False, highlight=False)
    if budget:
        console.print(f"[dim]max batch: the largest batch whose peak fits in {fmt_bytes(budget)}.[/dim]")
    _attention_note([e for _, e, _, _ in rows if e is not None], console)
    console.print(
        "[dim]params, grads, optim (optimizer state), masters (fp32 master weights), activ. (activations saved for "
        "backward); total: their sum. "
        "peak: most bytes of live tensors during two steps (batch and temporaries included), comparable with "
        "torch.cuda.max_memory_allocated; leave room for the CUDA context and allocator cache.[/dim]"
    )


def _attention_note(rows: list[MemoryEstimate], console: Console) -> None:
    """Say which CUDA attention kernels a simulated prediction modelled, per policy (nothing when none was)."""
    by_kernel: dict[str, list[str]] = {}
    for e in rows:
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
