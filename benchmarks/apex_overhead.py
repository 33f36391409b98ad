"""ampkit.apex's opt levels against the native loops they stand for, and against fp32.

Same model, weights, data and SGD-with-momentum on every side; only the loop differs:

    O0  vs  a plain fp32 loop
    O1  vs  the torch.amp loop (autocast around the forward; GradScaler when the 16-bit type is fp16)
    O2  vs  ampkit.Engine("bf16-true-masters" / "16-true-masters"), the same recipe through the engine

All contenders run interleaved in rounds whose order rotates; each step is timed alone; the table gives the
median per contender, its ratio to its native counterpart (the wrapper's overhead) and its speed-up over fp32.

    python benchmarks/apex_overhead.py                        # CNN with BatchNorm, bf16 on CPU
    python benchmarks/apex_overhead.py --model mlp --width 512
    python benchmarks/apex_overhead.py --device cuda --half float16 --width 2048 --batch 512
"""

from __future__ import annotations

import argparse
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
from ampkit.cli.env import collect_env

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
    model, opt = engine.setup(model, sgd(model))

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


def main() -> None:
    parser = argparse.ArgumentParser(description="ampkit.apex O0-O2 against native loops: medians and ratios.")
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--half", choices=["bfloat16", "float16"], default=None, help="16-bit type (default: bf16 on CPU, fp16 on CUDA)")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="steps per round per contender")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
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
    print(f"# apex_overhead  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv)}")
    print(f"# {args.model} width {args.width}, batch {args.batch}, SGD momentum 0.9, 16-bit type {half}")
    print("| contender | median step (ms) | vs its native counterpart | speed-up vs fp32 | steps |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        vs = f"{median[name] / median[native[name]]:.3f} ({native[name]})" if name in native else "-"
        print(f"| {name} | {median[name]:.3f} | {vs} | {median['fp32 loop'] / median[name]:.2f}x | {len(times[name])} |")


if __name__ == "__main__":
    main()
