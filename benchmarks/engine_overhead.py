"""The Engine's training step against the hand-written torch.amp loop it replaces.

Same model, weights, data, fused AdamW and gradient clipping on both sides; only the loop differs. The two
run interleaved in rounds (the order flips every round) so drift in the machine's clock or load hits both
alike; each step is timed alone and the table reports medians over all rounds and their ratio.

    python benchmarks/engine_overhead.py                       # CPU: 32-true, bf16-mixed, 16-mixed
    python benchmarks/engine_overhead.py --device cuda --width 4096 --batch 512
    python benchmarks/engine_overhead.py --precision bf16-mixed --rounds 20 --steps 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date

import torch
from torch import nn

import ampkit
from ampkit.cli.env import collect_env

Step = Callable[[torch.Tensor, torch.Tensor], None]


def mlp(width: int, depth: int, seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)).to(device)


def hand_written_step(policy: ampkit.Policy, model: nn.Module, clip: float, device: torch.device) -> Step:
    """The loop torch documents: autocast, GradScaler for fp16, unscale_ before clipping, fused AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(policy.name)
    scaler = torch.amp.GradScaler(device.type) if policy.name == "16-mixed" else None
    params = list(model.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, clip)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def engine_step(policy: ampkit.Policy, model: nn.Module, clip: float, device: torch.device) -> Step:
    engine = ampkit.Engine(policy, clip_grad_norm=clip)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Step, data: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> list[float]:
    times = []
    for x, y in data:
        sync(device)
        start = time.perf_counter()
        step(x, y)
        sync(device)  # a step is done when the device is done, not when the host has queued it
        times.append(time.perf_counter() - start)
    return times


def measure(policy: ampkit.Policy, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    steps = {
        "hand": hand_written_step(policy, mlp(args.width, args.depth, 0, device), args.clip, device),
        "engine": engine_step(policy, mlp(args.width, args.depth, 0, device), args.clip, device),
    }
    g = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(args.batch, args.width, generator=g).to(device), torch.randint(0, 10, (args.batch,), generator=g).to(device))
        for _ in range(args.steps)
    ]
    for step in steps.values():  # warm-up: first calls build kernels and allocate optimizer state
        time_steps(step, data[: args.warmup], device)
    times: dict[str, list[float]] = {"hand": [], "engine": []}
    for r in range(args.rounds):
        order = ["hand", "engine"] if r % 2 == 0 else ["engine", "hand"]
        for name in order:
            times[name] += time_steps(steps[name], data, device)
    hand, eng = statistics.median(times["hand"]), statistics.median(times["engine"])
    return {"hand_ms": 1e3 * hand, "engine_ms": 1e3 * eng, "ratio": eng / hand, "steps_each": len(times["hand"])}


def main() -> None:
    parser = argparse.ArgumentParser(description="Engine step vs hand-written torch.amp loop: medians and ratio.")
    parser.add_argument("--precision", default=None, help="comma-separated policies (default: 32-true,bf16-mixed,16-mixed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=20, help="steps per round per side")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = args.precision.split(",") if args.precision else ["32-true", "bf16-mixed", "16-mixed"]
    policies = [ampkit.get_policy(n) for n in names]
    for p in policies:
        p.check_device(device)

    results = {p.name: measure(p, args, device) for p in policies}
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else collect_env()["devices"][0]["name"]
    print(f"# engine_overhead  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv)}")
    print(f"# MLP {args.depth}x{args.width}, batch {args.batch}, fused AdamW, clip_grad_norm {args.clip}")
    print("| precision | hand-written torch.amp (ms) | ampkit Engine (ms) | ratio | steps each |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['hand_ms']:.3f} | {r['engine_ms']:.3f} | {r['ratio']:.3f} | {r['steps_each']} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "device": str(device), "machine": machine, "args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
