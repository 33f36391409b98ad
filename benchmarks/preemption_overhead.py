"""What ``engine.save_on_preemption()`` costs a training step: the same Engine step with the context off and on.

Same model, weights, data, fused AdamW and gradient clipping on both sides; only the context differs. The two run
interleaved in rounds (the order flips every round) so drift in the machine's clock or load hits both alike; each
step is timed alone and the table reports medians over all rounds and their ratio (on / off).

Beside the times, each single-process row counts one step of each side: its aten ops and its host syncs
(``ampkit.profile.count_step``). Counts are deterministic: in a single process the check is one attribute read, so
both counts must be equal. ``--ranks 2`` adds a row measured on two gloo ranks (DDP, on the CPU), where each check also
starts an asynchronous all-reduce of one int on a gloo group of its own and waits for the previous one.

    python benchmarks/preemption_overhead.py                    # CPU: bf16-mixed, one process and two gloo ranks
    python benchmarks/preemption_overhead.py --device cuda --width 2048 --batch 256 --ranks 1
    python benchmarks/preemption_overhead.py --smoke            # a few seconds: checks the script (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

import ampkit
from ampkit.policy._device import cpu_name
from ampkit.profile._op_count import count_step
from ampkit.workloads._timing import StepTimer

HEAD = ("| ranks | precision | width | batch | context off (ms) | context on (ms) | ratio on/off | steps each | ops/step off / on | "
        "syncs/step off / on |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def _setup(args: argparse.Namespace, device: torch.device, strategy: str | None) -> tuple[ampkit.Engine, Callable[[torch.Tensor, torch.Tensor], None]]:
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(*[m for _ in range(args.depth) for m in (nn.Linear(args.width, args.width), nn.GELU())], nn.Linear(args.width, 10))
    engine = ampkit.Engine(args.precision, clip_grad_norm=1.0, strategy=strategy)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()

    return engine, step


def _measure(args: argparse.Namespace, device: torch.device, strategy: str | None, ckpt: str) -> dict[str, Any]:
    """Interleaved rounds of ``args.steps`` steps with the context off and on; medians in ms and their ratio."""
    engine, step = _setup(args, device, strategy)
    g = torch.Generator(device=device).manual_seed(1)
    data = [(torch.randn(args.batch, args.width, generator=g, device=device), torch.randint(0, 10, (args.batch,), generator=g, device=device))
            for _ in range(args.steps)]
    timer = StepTimer(device)

    def run(on: bool) -> list[float]:
        with engine.save_on_preemption(ckpt) if on else contextlib.nullcontext():
            for x, y in data:
                with timer.step():
                    step(x, y)
            return timer.flush()  # inside: the distributed side's last all-reduce is waited for at the context's end

    for on in (False, True):
        run(on)  # warm-up: kernels, optimizer state, the gloo group's first all-reduce
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            times[on] += run(on)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    row: dict[str, Any] = {"precision": args.precision, "width": args.width, "batch": args.batch, "off_ms": 1e3 * off,
                           "on_ms": 1e3 * on, "ratio": on / off, "steps_each": len(times[False])}
    if strategy is None:
        counts = {}
        for on_ in (False, True):
            with engine.save_on_preemption(ckpt) if on_ else contextlib.nullcontext():
                counts[on_] = count_step(step, *data[0], warmup=0, device=device)
        row |= {"ops": [counts[False].ops, counts[True].ops], "syncs": [counts[False].syncs, counts[True].syncs]}
    return row


def _rank(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    row = _measure(args, torch.device("cpu"), "ddp", str(Path(out).parent / "never.pt"))
    if rank == 0:
        Path(out).write_text(json.dumps(row))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def row_line(r: dict[str, Any]) -> str:
    ops = "/".join(str(c) for c in r["ops"]) if "ops" in r else "-"
    syncs = "/".join(str(c) for c in r["syncs"]) if "syncs" in r else "-"
    return (f"| {r['ranks']} | {r['precision']} | {r['width']} | {r['batch']} | {r['off_ms']:.3f} | {r['on_ms']:.3f} | {r['ratio']:.3f} | "
            f"{r['steps_each']} | {ops} | {syncs} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Engine step with save_on_preemption() off and on: medians and ratio.")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="steps per round per side")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=2, choices=(1, 2), help="2: also a row on two gloo ranks (DDP, CPU)")
    parser.add_argument("--smoke", action="store_true", help="a few steps: checks the script works (CI), not a measurement")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds, args.width, args.depth, args.batch = 3, 2, 16, 1, 8
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"# preemption_overhead  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv if argv is None else ['benchmarks/preemption_overhead.py', *argv])}")
    print(f"# MLP depth {args.depth}, fused AdamW, clip_grad_norm 1.0; {args.rounds} rounds of {args.steps} steps per side; "
          "ratio = median step with the context on / median step with it off", flush=True)
    print(HEAD)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        row = {"ranks": 1, **_measure(args, device, None, str(Path(tmp) / "never.pt"))}
        rows.append(row)
        print(row_line(row), flush=True)
        if args.ranks == 2:
            out = Path(tmp) / "rank0.json"
            mp.start_processes(_rank, args=(2, str(Path(tmp) / "init"), args, str(out)), nprocs=2, start_method="spawn")
            row = {"ranks": 2, **json.loads(out.read_text())}
            rows.append(row)
            print(row_line(row), flush=True)
    report = {"torch": torch.__version__, "device": str(device), "machine": machine, "args": vars(args), "results": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
