"""What activation recomputation saves, and what it costs in step time, on the built-in workloads.

For each workload and precision, three copies of the same model train side by side on the same batches with
the same fused AdamW and clipping: no recomputation, ``ampkit.memory._recompute.recompute(model, "auto")``
(every repeated block checkpointed), and ``"auto"`` with a budget of half the activations (the fewest blocks
that fit). They run interleaved in rounds, the order rotating every round, so drift in the machine's clock or
load hits all alike; each step is timed alone and the table reports medians and ratios to no recomputation.

Activations are the bytes live between forward and backward of a real training step (weights, gradients,
optimizer state and batch left out), counted by ``LiveBytes`` on the step itself; ``recompute``'s own report,
measured on fake tensors, must agree with it (a ``*`` marks a disagreement).

    python benchmarks/recompute.py                                # CPU, size small, 32-true and bf16-mixed
    python benchmarks/recompute.py --workloads gpt,resnet --precision bf16-mixed --rounds 10 --steps 5
    python benchmarks/recompute.py --device cuda --size large --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from datetime import date
from typing import Any

import torch
from torch import nn

import ampkit
from ampkit.bench._runner import to_device
from ampkit.cli._env import collect_env
from ampkit.memory._accounting import LiveBytes, tensor_bytes
from ampkit.memory._recompute import RecomputeReport, recompute
from ampkit.workloads import get_workload, workload_names
from ampkit.workloads._timing import StepTimer

Step = Callable[..., None]
VARIANTS = ("none", "all blocks", "auto, half budget")


def call(model: nn.Module, inputs: Any) -> Any:
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def make_step(workload: Any, model: nn.Module, precision: str) -> tuple[Step, Callable[[], list[torch.Tensor]]]:
    """The runner's training step (Engine, autocast, fp32 loss, clipping, the workload's optimizer), and the tensors
    that exist between steps (weights, gradients, optimizer state): what the activations are counted on top of."""
    engine = ampkit.Engine(precision, clip_grad_norm=workload.clip_grad_norm)
    model, opt = engine.setup(model, workload.optimizer(model.parameters()))
    model.train()

    def step(x: Any, y: torch.Tensor, probe: Callable[[torch.Tensor], None] | None = None) -> None:
        with engine.autocast():
            out = call(model, x)
            loss = workload.loss_fn(out.float() if out.is_floating_point() else out, y)
            del out
        if probe is not None:
            probe(loss)
        engine.backward(loss)
        engine.step()

    def resting() -> list[torch.Tensor]:
        state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return [*model.parameters(), *model.buffers(), *grads, *state]

    return step, resting


def held_activations(step: Step, resting: Callable[[], list[torch.Tensor]], batch: Any) -> int:
    """Bytes live between forward and backward of one real step, above what exists between steps."""
    x, y = batch
    out: dict[str, int] = {}
    with LiveBytes() as live:
        live.track([*resting(), *[t for t in (x if isinstance(x, (tuple, list)) else [x]) if isinstance(t, torch.Tensor)], y])
        base = live.current

        def probe(loss: torch.Tensor) -> None:
            out["held"] = live.current - base - tensor_bytes([loss])

        step(x, y, probe)
    return out["held"]


def time_steps(step: Step, data: list[Any], device: torch.device) -> list[float]:
    timer = StepTimer(device)
    for x, y in data:
        with timer.step():
            step(x, y)
    return timer.flush()


def measure(name: str, precision: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    workload = get_workload(name, size=args.size, seed=0)
    data = [to_device(workload.batch(i), device, workload.channels_last) for i in range(args.steps)]
    base = workload.model.to(device)
    if workload.channels_last:
        base = base.to(memory_format=torch.channels_last)

    models: dict[str, nn.Module] = {}
    reports: dict[str, RecomputeReport | None] = {}
    errors: dict[str, str] = {}
    for variant in VARIANTS:
        model = copy.deepcopy(base)
        reports[variant] = None
        if variant != "none":
            full = reports.get("all blocks")
            budget = full.activations_before // 2 if variant.startswith("auto") and full is not None else None
            if variant.startswith("auto") and full is None:
                continue  # auto found nothing to checkpoint: no half-budget run either
            try:
                reports[variant] = recompute(model, "auto", budget=budget, example_batch=data[0], loss_fn=workload.loss_fn, policy=precision)
            except ValueError as exc:
                errors[variant] = str(exc).split(" (")[0].split(";")[0]
                continue
        models[variant] = model

    steps = {v: make_step(workload, m, precision) for v, m in models.items()}
    # The first step of each (kernel selection, optimizer state creation) is where the activations are counted.
    held = {v: held_activations(step, resting, data[0]) for v, (step, resting) in steps.items()}
    for step, _ in steps.values():
        time_steps(step, data[: args.warmup], device)
    times: dict[str, list[float]] = {v: [] for v in steps}
    order = list(steps)
    for r in range(args.rounds):
        for v in order[r % len(order):] + order[: r % len(order)]:
            times[v] += time_steps(steps[v][0], data, device)

    rows = []
    base_ms = 1e3 * statistics.median(times["none"])
    for variant in VARIANTS:
        row: dict[str, Any] = {"workload": name, "precision": precision, "recompute": variant}
        if variant in errors or variant not in steps:
            row["note"] = errors.get(variant, "skipped")
            rows.append(row)
            continue
        report = reports[variant]
        ms = 1e3 * statistics.median(times[variant])
        row.update(
            blocks=len(report.modules) if report else 0,
            activations_before=held["none"], activations_after=held[variant], ratio=held[variant] / held["none"],
            step_ms_before=base_ms, step_ms_after=ms, time_cost=ms / base_ms, steps_each=len(times[variant]),
            peak_before=report.peak_before if report else None, peak_after=report.peak_after if report else None,
            report_agrees=report is None or (report.activations_before, report.activations_after) == (held["none"], held[variant]),
        )
        rows.append(row)
    return rows


def mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # digits-aug is digits behind a slow DataLoader (the profile's workload): the same model, nothing new here.
    parser.add_argument("--workloads", default=",".join(n for n in workload_names() if n != "digits-aug"))
    parser.add_argument("--size", default="small", choices=("tiny", "small", "large"))
    parser.add_argument("--precision", default="32-true,bf16-mixed", help="comma-separated policies")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=4, help="steps per round per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    precisions = args.precision.split(",")
    for p in precisions:
        ampkit.get_policy(p).check_device(device)

    rows = [row for name in args.workloads.split(",") for p in precisions for row in measure(name, p, args, device)]
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else collect_env()["devices"][0]["name"]
    print(f"# recompute  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv)}")
    print(f"# size {args.size}; medians of {args.rounds} rounds x {args.steps} steps per variant, interleaved; ratios to no recomputation")
    head = ["workload", "precision", "recompute", "blocks", "activations before (MiB)", "after (MiB)", "ratio",
            "step before (ms)", "after (ms)", "time cost", "peak fwd+bwd before → after (MiB)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|")
    for r in rows:
        if "note" in r:
            print(f"| {r['workload']} | {r['precision']} | {r['recompute']} | — | — | — | — | — | — | — | {r['note']} |")
            continue
        if r["recompute"] == "none":
            continue  # its figures are the "before" columns of the rows below
        mark = "" if r["report_agrees"] else " *"
        print(
            f"| {r['workload']} | {r['precision']} | {r['recompute']} | {r['blocks']} | {mib(r['activations_before'])} | "
            f"{mib(r['activations_after'])}{mark} | {r['ratio']:.2f} | {r['step_ms_before']:.1f} | {r['step_ms_after']:.1f} | "
            f"{r['time_cost']:.2f} | {mib(r['peak_before'])} → {mib(r['peak_after'])} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "device": str(device), "machine": machine, "args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
