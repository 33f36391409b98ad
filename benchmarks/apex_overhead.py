"""ampkit.apex's opt levels against the native loops they stand for, and against fp32.

Same model, weights, data and SGD-with-momentum on every side; only the loop differs:

    O0  vs  a plain fp32 loop
    O1  vs  the torch.amp loop (autocast around the forward; GradScaler when the 16-bit type is fp16)
    O2  vs  ampkit.Engine("bf16-true-masters" / "16-true-masters"), the same recipe through the engine

All contenders run interleaved in rounds whose order rotates; each step is timed alone; the table gives the
median per contender, its ratio to its native counterpart (the wrapper's overhead) and its speed-up over fp32.

    python benchmarks/apex_overhead.py                        # CNN with BatchNorm, bf16 on CPU
    python benchmarks/apex_overhead.py --model mlp --width 512
    python benchmarks/apex_overhead.py --device cuda --half float16 --width 2048 --batch 512   # MLP (CUDA's default)
    python benchmarks/apex_overhead.py --smoke --json out.json   # seconds: checks the script runs (CI)

The model defaults to the CNN on the CPU and to the MLP on CUDA: at a tensor-core width (2048) the CNN's
full-resolution first layer alone holds 4 GB of fp32 activations per batch of 512 and its fp32 steps take
about a second each, so eight contenders would need minutes; ``--model cnn`` asks for it anyway.
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
from ampkit.apex import amp
from ampkit.apex._state import _amp_state
from ampkit.cli._env import collect_env

Step = Callable[[torch.Tensor, torch.Tensor], None]


def build(kind: str, width: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        layers: list[nn.Module] = []
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    return nn.Sequential(  # (B, 3, 32, 32) -> 10 classes; BatchNorm is what O2 keeps in fp32
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1, stride=2), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10),
    ).to(device)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def plain_step(model: nn.Module, device: torch.device, half: torch.dtype | None) -> Step:
    opt = sgd(model)
    scaler = torch.amp.GradScaler(device.type) if half == torch.float16 else None

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None):
            out = model(x)
        loss = nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    return step


def apex_step(model: nn.Module, level: str, half: torch.dtype, **overrides: object) -> Step:
    opt = sgd(model)
    model, opt = amp.initialize(model, opt, opt_level=level, verbosity=0, half_dtype=half, **overrides)
    session = _amp_state.session  # several initialize calls live side by side here; keep each one's own

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        _amp_state.session = session
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        with amp.scale_loss(loss, opt) as scaled_loss:
            scaled_loss.backward()
        opt.step()

    return step


def engine_step(model: nn.Module, half: torch.dtype) -> Step:
    engine = ampkit.Engine("bf16-true-masters" if half == torch.bfloat16 else "16-true-masters")
    model, _opt = engine.setup(model, sgd(model))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        engine.backward(loss)
        engine.step()

    return step


def time_steps(step: Step, data: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> list[float]:
    times = []
    for x, y in data:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a step is done when the device is done
        times.append(time.perf_counter() - start)
    return times


# What --smoke changes unless given explicitly: a run of seconds that still builds and steps every contender.
SMOKE = {"width": 8, "batch": 8, "steps": 2, "rounds": 2, "warmup": 1}
DEFAULTS = {"width": 32, "batch": 64, "steps": 10, "rounds": 8, "warmup": 3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ampkit.apex O0-O2 against native loops: medians and ratios.")
    parser.add_argument("--model", choices=["cnn", "mlp"], default=None, help="default: cnn on the CPU, mlp on CUDA and with --smoke")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half", choices=["bfloat16", "float16"], default=None, help="16-bit type (default: bf16 on CPU, fp16 on CUDA)")
    parser.add_argument("--width", type=int, default=None, help=f"default {DEFAULTS['width']}")
    parser.add_argument("--batch", type=int, default=None, help=f"default {DEFAULTS['batch']}")
    parser.add_argument("--steps", type=int, default=None, help=f"steps per round per contender (default {DEFAULTS['steps']})")
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULTS['rounds']}")
    parser.add_argument("--warmup", type=int, default=None, help=f"default {DEFAULTS['warmup']}")
    parser.add_argument("--smoke", action="store_true", help=f"a run of seconds to check the script works: {SMOKE} unless given")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the table and the run's settings as JSON")
    args = parser.parse_args(argv)
    for name, value in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model is None:
        args.model = "mlp" if args.smoke or torch.device(args.device).type == "cuda" else "cnn"
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Run the comparison, print the table; returns what --json writes."""
    args = parse_args(argv)
    device = torch.device(args.device)
    half = getattr(torch, args.half) if args.half else (torch.bfloat16 if device.type == "cpu" else torch.float16)

    contenders: dict[str, Step] = {
        "fp32 loop": plain_step(build(args.model, args.width, device), device, None),
        "apex O0": apex_step(build(args.model, args.width, device), "O0", half),
        "torch.amp loop": plain_step(build(args.model, args.width, device), device, half),
        "apex O1": apex_step(build(args.model, args.width, device), "O1", half),
        # Apex's O1 scales the loss dynamically even where the 16-bit type is bf16, which needs no scaling;
        # loss_scale=1.0 drops the unscale/overflow-check work (and with it the skipping of bad steps).
        "apex O1 loss_scale=1": apex_step(build(args.model, args.width, device), "O1", half, loss_scale=1.0),
        "Engine masters": engine_step(build(args.model, args.width, device), half),
        "apex O2": apex_step(build(args.model, args.width, device), "O2", half),
        "apex O2 loss_scale=1": apex_step(build(args.model, args.width, device), "O2", half, loss_scale=1.0),
    }
    native = {"apex O0": "fp32 loop", "apex O1": "torch.amp loop", "apex O1 loss_scale=1": "torch.amp loop", "apex O2": "Engine masters",
              "apex O2 loss_scale=1": "Engine masters"}
    g = torch.Generator().manual_seed(1)
    shape = (args.width,) if args.model == "mlp" else (3, 32, 32)
    data = [
        (torch.randn(args.batch, *shape, generator=g).to(device), torch.randint(0, 10, (args.batch,), generator=g).to(device))
        for _ in range(args.steps)
    ]
    for step in contenders.values():
        time_steps(step, data[: args.warmup], device)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name] += time_steps(contenders[name], data, device)
    median = {name: 1e3 * statistics.median(t) for name, t in times.items()}

    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else collect_env()["devices"][0]["name"]
    command = f"python {' '.join(sys.argv if argv is None else ['benchmarks/apex_overhead.py', *argv])}"
    print(f"# apex_overhead  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# {args.model} width {args.width}, batch {args.batch}, SGD momentum 0.9, 16-bit type {half}")
    print("| contender | median step (ms) | vs its native counterpart | speed-up vs fp32 | steps |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name in names:
        ratio = median[name] / median[native[name]] if name in native else None
        vs = f"{ratio:.3f} ({native[name]})" if ratio is not None else "-"
        print(f"| {name} | {median[name]:.3f} | {vs} | {median['fp32 loop'] / median[name]:.2f}x | {len(times[name])} |")
        rows.append({
            "contender": name, "median_ms": median[name], "native": native.get(name), "vs_native": ratio,
            "speedup_vs_fp32": median["fp32 loop"] / median[name], "steps": len(times[name]),
        })
    result: dict[str, object] = {
        "benchmark": "apex_overhead", "date": str(date.today()), "command": command, "torch": torch.__version__,
        "device": str(device), "machine": machine, "threads": torch.get_num_threads(), "model": args.model,
        "width": args.width, "batch": args.batch, "half": str(half).removeprefix("torch."), "smoke": args.smoke, "rows": rows,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
