"""The Engine's training step against the hand-written torch.amp loop it replaces.

Same model, weights, data, fused AdamW and gradient clipping on both sides; only the loop differs. The two
run interleaved in rounds (the order flips every round) so drift in the machine's clock or load hits both
alike; each step is timed alone (CUDA events on a GPU, so the host may run ahead as in training and a
host-bound step shows as one) and the table reports medians over all rounds and their ratio.

An overhead is a fixed cost per step, so its ratio depends on the step's length. ``--step-ms 2,20`` measures
at a 2 ms and at a 20 ms step: for each target and precision a few short timed probes of the hand-written
loop scale the MLP's width (and the batch with it, keeping their ratio) until its step lands within 10% of
the target on this device; the table gives the size found and the step time achieved. Each probe is printed as it
ends, ``--calibrate-s`` bounds the search, and the MLPs are built on the device: the first GPU run spent more than
55 s calibrating before measuring anything, most of it initialising 10k-wide MLPs (300 M parameters) on the host
for each probe of the 20 ms bf16 and fp16 rows. With the defaults a row runs at most 8 probes of 7 steps, then 2
sides x 10 rounds x 20 timed steps: about 10 s at 20 ms and 1 s at 2 ms. The GPU suite runs 6 rounds of 15 with a
3 s calibration budget, within its 25 s.

Beside the times, each row counts one step of each side: its aten ops (what a GPU launches, one kernel or a few
each) and its host syncs (``ampkit.profile.count_step``). Counts are deterministic, so the CPU gives a GPU's
figures, and an overhead in the times can be traced to the ops that make it. Each row is printed the moment it is
measured, and ``--time-limit`` skips the rows not started by then.

    python benchmarks/engine_overhead.py                       # CPU: 32-true, bf16-mixed, 16-mixed
    python benchmarks/engine_overhead.py --device cuda --step-ms 2,20
    python benchmarks/engine_overhead.py --device cuda --width 4096 --batch 512
    python benchmarks/engine_overhead.py --precision bf16-mixed --rounds 20 --steps 30 --json out.json
    python benchmarks/engine_overhead.py --smoke --step-ms 2,20  # a few seconds: checks the script (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
from torch import nn

import ampkit
from ampkit.policy._device import cpu_name
from ampkit.profile._op_count import count_step
from ampkit.workloads._timing import StepTimer
from measured_rows import Deadline, Printer, add_time_limit, attempt

Step = Callable[[torch.Tensor, torch.Tensor], None]
Batch = tuple[torch.Tensor, torch.Tensor]


def mlp(width: int, depth: int, seed: int, device: torch.device) -> nn.Module:
    """The MLP, initialised where it runs: a calibrated 20 ms bf16 step on a GPU is a ~10k-wide MLP (300 M
    parameters), whose initialisation on the host took seconds per probe in the first GPU run."""
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    layers: list[nn.Module] = []
    with torch.device(device):
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(width, 10))


def hand_written_step(policy: ampkit.Policy, model: nn.Module, clip: float, device: torch.device) -> Step:
    """The loop torch documents: autocast, GradScaler for fp16, unscale_ before clipping, fused AdamW.

    Fused AdamW takes the scaler's found_inf on the device and skips an overflowed step inside its kernel, so
    neither loop syncs with the host.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(policy.name)
    scaler = torch.amp.GradScaler(device.type) if policy.name == "16-mixed" else None
    params = list(model.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
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


def engine_step(policy: ampkit.Policy, model: nn.Module, clip: float, device: torch.device, nonfinite_check: bool = True) -> Step:
    # --no-nonfinite-check: the engine without the non-finite check it makes by default under every policy (which the
    # hand loop does not make), so the table can tell that check's cost from the rest of the engine's. A loss scaler
    # always checks (it must): there the option changes nothing.
    try:
        engine = ampkit.Engine(policy, clip_grad_norm=clip, skip_nonfinite=None if nonfinite_check else False)
    except ValueError:
        engine = ampkit.Engine(policy, clip_grad_norm=clip)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()

    return step


def time_steps(step: Step, data: list[Batch], timer: StepTimer) -> list[float]:
    for x, y in data:
        with timer.step():
            step(x, y)
    return timer.flush()


def batches(n: int, batch: int, width: int, device: torch.device) -> list[Batch]:
    # Made on the device from a seeded generator: a calibrated size can be large, and a host copy is slow.
    g = torch.Generator(device=device).manual_seed(1)
    return [
        (torch.randn(batch, width, generator=g, device=device), torch.randint(0, 10, (batch,), generator=g, device=device))
        for _ in range(n)
    ]


def batch_for(width: int, ratio: float) -> int:
    batch = max(1, round(width * ratio))
    return batch if batch < 8 else 8 * round(batch / 8)  # tensor cores like multiples of 8


def probe(policy: ampkit.Policy, width: int, args: argparse.Namespace, device: torch.device) -> float:
    """Median seconds of the hand-written step at ``width`` after a short warm-up."""
    step = hand_written_step(policy, mlp(width, args.depth, 0, device), args.clip, device)
    data = batches(args.probe_steps, batch_for(width, args.batch / args.width), width, device)
    timer = StepTimer(device)
    time_steps(step, data[:1], timer)  # first call: kernels, optimizer state
    return statistics.median(time_steps(step, data, timer))


def next_width(probes: list[tuple[int, float]], target_s: float) -> int:
    """The width to probe next, from the probes so far (``(width, seconds)``, latest last).

    A step costs a fixed part (kernel launches, Python) plus work growing as width**2 * batch, i.e. width**3
    with the batch in proportion. With two probes the line through them in width**3 gives both parts and the
    width that hits the target; with one, or when noise gives that line no positive slope, the width moves by
    the cube root of the remaining factor. Each move is at most 4x, a multiple of 8, at least 8.
    """
    width, seconds = probes[-1]
    guess = width * (target_s / seconds) ** (1 / 3)
    if len(probes) > 1:
        w0, s0 = probes[-2]
        slope = (seconds - s0) / (width**3 - w0**3)
        fixed = seconds - slope * width**3
        if slope > 0:
            # Below the fixed part no width reaches the target: head for the smallest, the closest one can get.
            guess = ((target_s - fixed) / slope) ** (1 / 3) if target_s > fixed else width / 4
    guess = min(4 * width, max(width / 4, guess))
    return max(8, 8 * round(guess / 8))


def calibrate(
    policy: ampkit.Policy, target_s: float, args: argparse.Namespace, device: torch.device, deadline: Deadline | None = None
) -> tuple[int, int]:
    """Width and batch at which the hand-written step of ``policy`` takes about ``target_s`` on ``device``.

    Probes from ``--width`` (see :func:`next_width`) until a step lands within 10% of the target, the next
    width repeats one already probed, ``--probes`` run out, or ``--calibrate-s`` seconds (or the deadline) are
    spent; returns the size of the closest probe. Each probe is printed as it ends (``# probe ...``), so a run cut
    at its limit shows where its time went.
    """
    probes: list[tuple[int, float]] = []
    width = args.width
    spent = time.perf_counter()
    budget_s = getattr(args, "calibrate_s", None)
    for _ in range(args.probes):
        started = time.perf_counter()
        probes.append((width, probe(policy, width, args, device)))
        print(f"# probe {policy.name} for {1e3 * target_s:g} ms: width {width} -> {1e3 * probes[-1][1]:.3f} ms "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        if abs(math.log(probes[-1][1] / target_s)) < math.log(1.1):
            break
        if (budget_s is not None and time.perf_counter() - spent > budget_s) or (deadline is not None and deadline.passed()):
            break
        width = next_width(probes, target_s)
        if any(width == w for w, _ in probes):
            break
    best = min(probes, key=lambda p: abs(math.log(p[1] / target_s)))[0]
    return best, batch_for(best, args.batch / args.width)


def measure(policy: ampkit.Policy, width: int, batch: int, args: argparse.Namespace, device: torch.device) -> dict[str, float | int]:
    steps = {
        "hand": hand_written_step(policy, mlp(width, args.depth, 0, device), args.clip, device),
        "engine": engine_step(policy, mlp(width, args.depth, 0, device), args.clip, device, args.nonfinite_check),
    }
    data = batches(args.steps, batch, width, device)
    timer = StepTimer(device)
    for step in steps.values():  # warm-up: first calls build kernels and allocate optimizer state
        time_steps(step, data[: args.warmup], timer)
    # One more step each, untimed, counting its aten ops and host syncs: deterministic, so the CPU shows a GPU's
    # counts, and an overhead found in the times below can be traced to the ops that make it.
    counts = {name: count_step(step, *data[0], warmup=0, device=device) for name, step in steps.items()}
    times: dict[str, list[float]] = {"hand": [], "engine": []}
    for r in range(args.rounds):
        order = ["hand", "engine"] if r % 2 == 0 else ["engine", "hand"]
        for name in order:
            times[name] += time_steps(steps[name], data, timer)
    hand, eng = statistics.median(times["hand"]), statistics.median(times["engine"])
    return {"width": width, "batch": batch, "hand_ms": 1e3 * hand, "engine_ms": 1e3 * eng, "ratio": eng / hand, "steps_each": len(times["hand"]),
            "ops_hand": counts["hand"].ops, "ops_engine": counts["engine"].ops, "syncs_hand": counts["hand"].syncs, "syncs_engine": counts["engine"].syncs}


def sized_measure(policy: ampkit.Policy, target_ms: float | None, args: argparse.Namespace, device: torch.device, deadline: Deadline) -> dict[str, float | int]:
    """One row: the size calibrated to ``target_ms`` (or the given one), then the interleaved measurement."""
    width, batch = calibrate(policy, target_ms / 1e3, args, device, deadline) if target_ms is not None else (args.width, args.batch)
    return measure(policy, width, batch, args, device)


HEAD = (
    "| precision | target (ms) | MLP width | batch | hand-written torch.amp (ms) | ampkit Engine (ms) | ratio | steps each | "
    "ops/step hand | ops/step engine | syncs/step hand / engine |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def row_line(r: dict[str, object]) -> str:
    target = "-" if r["target_ms"] is None else f"{r['target_ms']:g}"
    if r["status"] != "ok":
        return f"| {r['precision']} | {target} | {r['status']}: {r['reason']} | | | | | | | | |"
    return (
        f"| {r['precision']} | {target} | {r['width']} | {r['batch']} | {r['hand_ms']:.3f} | {r['engine_ms']:.3f} | {r['ratio']:.3f} | {r['steps_each']} "
        f"| {r['ops_hand']} | {r['ops_engine']} | {r['syncs_hand']} / {r['syncs_engine']} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Engine step vs hand-written torch.amp loop: medians and ratio.")
    parser.add_argument("--precision", default=None, help="comma-separated policies (default: 32-true,bf16-mixed,16-mixed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=256, help="MLP width (with --step-ms: where calibration starts)")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="batch (with --step-ms: kept in this ratio to the width)")
    parser.add_argument("--step-ms", help="comma-separated target step times in ms, e.g. 2,20: calibrate the size to each")
    parser.add_argument("--probes", type=int, default=8, help="most calibration probes per target and precision")
    parser.add_argument("--probe-steps", type=int, default=6, help="timed steps per calibration probe")
    parser.add_argument("--calibrate-s", type=float, default=None, help="stop probing a row's size after this many seconds (default: no limit)")
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--no-nonfinite-check", dest="nonfinite_check", action="store_false",
                        help="the engine with skip_nonfinite=False where it has no loss scaler: without the non-finite check it makes by default")
    parser.add_argument("--steps", type=int, default=20, help="steps per round per side")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a few steps and probes: checks the script works (CI), not a measurement")
    parser.add_argument("--json", help="also write the results to this file")
    add_time_limit(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds, args.warmup, args.probes, args.probe_steps = 2, 2, 1, 2, 1
    try:
        args.targets_ms = [float(t) for t in args.step_ms.split(",")] if args.step_ms else [None]
    except ValueError:
        parser.error(f"--step-ms {args.step_ms!r}: give step times in milliseconds separated by commas, e.g. --step-ms 2,20.")
    if any(t is not None and not t > 0 for t in args.targets_ms):
        parser.error(f"--step-ms {args.step_ms!r}: every target must be a positive number of milliseconds.")
    for key in ("width", "depth", "batch", "probes", "probe_steps", "steps", "rounds", "warmup"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} {getattr(args, key)}: must be at least 1.")
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    device = torch.device(args.device)
    names = args.precision.split(",") if args.precision else ["32-true", "bf16-mixed", "16-mixed"]
    policies = [ampkit.get_policy(n) for n in names]
    for p in policies:
        try:
            p.check_device(device)
        except ampkit.UnsupportedPolicyError as error:
            sys.exit(f"engine_overhead: {error}")

    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"# engine_overhead  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv if argv is None else ['benchmarks/engine_overhead.py', *argv])}")
    check = "" if args.nonfinite_check else "; engine without the non-finite check (skip_nonfinite=False) where it has no loss scaler"
    print(f"# MLP depth {args.depth}, fused AdamW, clip_grad_norm {args.clip}; {args.rounds} rounds of {args.steps} steps per side{check}", flush=True)
    deadline = Deadline(args.time_limit)
    emit = Printer().table(HEAD, row_line)
    rows = []
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():  # events of the chosen GPU
        for target in args.targets_ms:
            for p in policies:
                row: dict[str, object] = {"precision": p.name, "target_ms": target}
                late = deadline.passed()
                row |= {"status": "skipped", "reason": late} if late else attempt(functools.partial(sized_measure, p, target, args, device, deadline), device)
                rows.append(row)
                emit(row)
    report = {"torch": torch.__version__, "device": str(device), "machine": machine, "args": vars(args), "results": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
