"""ResNet-50 training throughput, channels_last: AMP (fp16, bf16) against TF32 and FP32, and ampkit's Engine.

NVIDIA's published figure for this model is AMP at 2.63x TF32 on an A100. Every contender trains the same
ResNet-50 (torchvision's when it is installed, else the same network defined below) from the same initial
weights on the same synthetic batch, with SGD and momentum, model and inputs in channels_last:

    AMP bf16          torch.autocast(bfloat16)
    AMP fp16          torch.autocast(float16) + torch.amp.GradScaler, the loop torch documents
    Engine bf16-mixed ampkit.Engine("bf16-mixed"), which should reach the hand-written AMP bf16 figure
    Engine 16-mixed   ampkit.Engine("16-mixed"), likewise against AMP fp16
    TF32              fp32, TF32 on for both matmuls and cuDNN (CUDA sm80+; n/a elsewhere)
    FP32              fp32, TF32 off for matmuls and cuDNN

The AMP and Engine rows run with TF32 on, as NVIDIA's AMP runs do, so an fp32 op left outside autocast takes
the fastest fp32 path. Each contender warms up (its first step carries cuDNN's algorithm search, its
optimizer state and the loss scale settling) and runs its first timed round at once; then the contenders run the
other rounds interleaved, the order flipping every round, and each step is timed with CUDA events (wall clock on
CPU). The table gives the median step over every round, images/s, the speed-ups over TF32 and over FP32, and each
contender's first step (what its warm-up cost).

**cuDNN's algorithm search** (``cudnn.benchmark``) times every candidate algorithm of every new convolution
shape, forward and both backwards. In fp16/bf16 the candidates are fast; in true fp32 on a GPU (TF32 off) some
are very slow, and the first GPU run spent more than 65 s in the FP32 contender's first backward at batch 256
(``benchmarks/results/h200-2026-11-27/rerun-cnn-faulthandler.log``). So the search is on for every contender
but FP32, which takes cuDNN's heuristic choice (``--fp32-search`` turns the search on for it too), and FP32 runs
last, should the time limit (``--time-limit``) stop the run before it. Each contender's row is printed the moment
it is measured, before the next contender starts (a first table: its first step, its warm-up, its first round's
median step), then the table over every round after the last. Every global switch changed (TF32,
cudnn.benchmark) is restored on exit.

    python benchmarks/cnn_throughput.py --device cuda --batch 128     # the GPU suite's run
    python benchmarks/cnn_throughput.py --device cpu --smoke          # tiny batch, image and width: the CI check
    python benchmarks/cnn_throughput.py --device cuda --json out.json --time-limit 40

Default CUDA schedule: 3 warm-up steps, then 3 rounds of 8 timed steps per contender (24 each). An H100/H200 step
at batch 128 takes about 0.05 s under AMP, 0.08 s in TF32 and 0.1-0.2 s in FP32: about 3 s a round and 10 s
timed, plus the warm-ups.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import ampkit
from ampkit.policy._device import cpu_name
from ampkit.workloads._timing import StepTimer
from measured_rows import Deadline, Printer, add_time_limit

Step = Callable[[], None]
NUM_CLASSES = 1000


# --------------------------------------------------------------------------------------------- the model
class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block (v1.5: the stride sits on the 3x3 convolution), same names and init."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(nn.Module):
    """ResNet-50 as ``torchvision.models.resnet50(weights=None)`` builds it: the same layers, parameter names
    (its state_dict loads into torchvision's and back) and initialisation; for machines without torchvision.

    ``width`` is the stem's channel count (64 in ResNet-50; every stage scales with it): the smoke run uses the
    same 50 layers at width 8, whose 0.4 M parameters keep a CPU step short.
    """

    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = width
        for i, (planes, blocks, stride) in enumerate(((width, 3, 1), (2 * width, 4, 2), (4 * width, 6, 2), (8 * width, 3, 2)), start=1):
            out = planes * Bottleneck.expansion
            # Every stage's first block changes the channel count, so it always has a projection shortcut.
            downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
            layers = [Bottleneck(inplanes, planes, stride, downsample)] + [Bottleneck(out, planes) for _ in range(blocks - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*layers))
            inplanes = out
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        # torchvision's init: He-normal convolutions (fan_out); its BatchNorm weight 1, bias 0 are torch's defaults.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(seed: int, width: int = 64) -> tuple[nn.Module, str]:
    """A freshly initialised ResNet-50 (stem ``width``) on the CPU and where it came from; nothing is downloaded."""
    torch.manual_seed(seed)
    if width != 64:
        return ResNet50(width=width), f"ResNet-50 layers at width {width} (ResNet-50: 64), defined in benchmarks/cnn_throughput.py"
    try:
        from torchvision.models import resnet50 as tv_resnet50
    except ImportError:
        return ResNet50(), "ResNet50 defined in benchmarks/cnn_throughput.py (torchvision is not installed)"
    return tv_resnet50(weights=None), "torchvision.models.resnet50(weights=None)"


# --------------------------------------------------------------------------------------------- contenders
@dataclass(frozen=True)
class Contender:
    """One row of the table: how its step computes, and the ampkit policy whose support it needs on the device."""

    name: str
    needs: str  # policy name: its support() says whether this device runs the row
    tf32: bool
    autocast: torch.dtype | None = None
    engine: str | None = None  # an ampkit policy: the step runs through ampkit.Engine
    search: bool = True  # cuDNN's algorithm search (cudnn.benchmark) during its steps


CONTENDERS = (  # most telling first; FP32 last: its warm-up is the slowest (see the module notes)
    Contender("AMP bf16", needs="bf16-mixed", tf32=True, autocast=torch.bfloat16),
    Contender("AMP fp16", needs="16-mixed", tf32=True, autocast=torch.float16),
    Contender("Engine bf16-mixed", needs="bf16-mixed", tf32=True, engine="bf16-mixed"),
    Contender("Engine 16-mixed", needs="16-mixed", tf32=True, engine="16-mixed"),
    Contender("TF32", needs="tf32", tf32=True),
    Contender("FP32", needs="32-true", tf32=False, search=False),
)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


def make_step(c: Contender, model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> Step:
    """One training step of ``c`` on ``model`` (already on ``device`` in channels_last) with batch ``(x, y)``."""
    if c.engine is not None:
        engine = ampkit.Engine(c.engine)
        model, _ = engine.setup(model, _sgd(model))

        def engine_step() -> None:
            with engine.autocast():
                loss = F.cross_entropy(model(x), y)
            engine.backward(loss)
            engine.step()

        return engine_step

    opt = _sgd(model)
    scaler = torch.amp.GradScaler(device.type) if c.autocast == torch.float16 else None

    def step() -> None:
        context = torch.autocast(device.type, dtype=c.autocast) if c.autocast is not None else contextlib.nullcontext()
        with context:
            loss = F.cross_entropy(model(x), y)  # autocast runs cross_entropy in fp32 itself
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# --------------------------------------------------------------------------------------------- global switches
@contextlib.contextmanager
def restored_switches() -> Iterator[None]:
    """Restore TF32 (matmul precision and cuDNN) and cudnn.benchmark as they were, whatever happens inside."""
    matmul, cudnn_tf32, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        # The precision string, not allow_tf32: a caller's "medium" must come back as "medium", not "high".
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.backends.cudnn.benchmark = benchmark


def set_tf32(enabled: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


# --------------------------------------------------------------------------------------------- measuring
AS_MEASURED = (
    "| contender, first round as measured | TF32 | cuDNN search | first step (s) | warm-up (s) | step (ms), first round median |\n"
    "|---|---|---|---:|---:|---:|"
)


def as_measured_line(r: dict[str, object]) -> str:
    """A contender's row the moment it is measured: its warm-up, then the median step of its first round."""
    if r["status"] != "ok":
        return f"| {r['name']} | {r['status']}: {str(r['reason']).replace('|', '/')} | | | | |"
    return (f"| {r['name']} | {'on' if r['tf32'] else 'off'} | {'on' if r['cudnn_search'] else 'off'} | {r['first_step_s']:.2f} "
            f"| {r['warmup_s']:.2f} | {r['first_round_ms']:.1f} |")


def measure(args: argparse.Namespace, device: torch.device, deadline: Deadline | None = None) -> tuple[dict[str, dict[str, object]], str]:
    """Every contender's row: each warms up and runs its first timed round, its row printed before the next starts
    (a run cut at its limit keeps them), then the other rounds interleaved until the last or the deadline."""
    deadline = deadline or Deadline(None)
    emit = Printer().table(AS_MEASURED, as_measured_line)
    base, source = resnet50(seed=0, width=args.width)
    print(f"# {source}; batch {args.batch}, {args.image}x{args.image} px", flush=True)
    g = torch.Generator(device=device).manual_seed(1)
    # One synthetic ImageNet-shaped batch, made on the device: no host-to-device copy in the timed loop.
    x = torch.randn(args.batch, 3, args.image, args.image, generator=g, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, NUM_CLASSES, (args.batch,), generator=g, device=device)

    results: dict[str, dict[str, object]] = {}
    steps: dict[str, tuple[Contender, Step]] = {}
    timer = StepTimer(device)

    def run(c: Contender, step: Step, n: int) -> list[float]:
        set_tf32(c.tf32 and device.type == "cuda")  # TF32 is a CUDA mode; on CPU every row computes in plain fp32
        torch.backends.cudnn.benchmark = c.search or args.fp32_search
        for _ in range(n):
            with timer.step():
                step()
        return timer.flush()

    times: dict[str, list[float]] = {}
    for c in CONTENDERS:
        support = ampkit.get_policy(c.needs).support(device)
        late = deadline.passed()
        if not support.supported or late:
            results[c.name] = {"status": "n/a", "reason": support.reason} if not support.supported else {"status": "skipped", "reason": late}
            emit({"name": c.name, **results[c.name]})
            continue
        model = copy.deepcopy(base).to(device=device, memory_format=torch.channels_last)  # same initial weights
        step = make_step(c, model, x, y, device)
        search = c.search or args.fp32_search
        results[c.name] = {"status": "ok", "tf32": c.tf32 and device.type == "cuda", "cudnn_search": search and device.type == "cuda"}
        start = time.perf_counter()
        warm = run(c, step, max(args.warmup, 1))  # the first step: cuDNN's search, optimizer state, the scale settling
        results[c.name].update(first_step_s=warm[0], warmup_s=time.perf_counter() - start)
        steps[c.name] = (c, step)
        times[c.name] = run(c, step, args.steps)  # its first round, at once: its row is printed before the next starts
        results[c.name]["first_round_ms"] = 1e3 * statistics.median(times[c.name])
        emit({"name": c.name, **results[c.name]})

    order = list(steps)
    for r in range(1, args.rounds):  # the other rounds interleaved, the order flipping every round
        if deadline.passed():
            print(f"# rounds: {r} of {args.rounds} done when the time limit was reached", flush=True)
            break
        for name in order[::-1] if r % 2 else order:
            times[name] += run(*steps[name], args.steps)

    for name, t in times.items():
        median = statistics.median(t)
        results[name].update(step_ms=1e3 * median, images_per_s=args.batch / median, steps_timed=len(t))
    for name, ref in (("vs_tf32", "TF32"), ("vs_fp32", "FP32")):
        for r in results.values():
            if r["status"] == "ok" and results[ref]["status"] == "ok":
                r[name] = results[ref]["step_ms"] / r["step_ms"]  # type: ignore[operator]
    return results, source


def table(results: dict[str, dict[str, object]]) -> list[str]:
    def speedup(r: dict[str, object], key: str) -> str:
        return f"{r[key]:.2f}x" if key in r else "n/a"

    lines = ["| contender | TF32 | cuDNN search | step (ms) | images/s | vs TF32 | vs FP32 | first step (s) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        if r["status"] != "ok":
            lines.append(f"| {name} | {r['status']}: {str(r['reason']).replace('|', '/')} | | | | | | |")
            continue
        tf32 = "on" if r["tf32"] else "off"
        search = "on" if r["cudnn_search"] else "off"
        lines.append(
            f"| {name} | {tf32} | {search} | {r['step_ms']:.1f} | {r['images_per_s']:.1f} | {speedup(r, 'vs_tf32')} | "
            f"{speedup(r, 'vs_fp32')} | {r['first_step_s']:.2f} |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ResNet-50 training throughput, channels_last: AMP vs TF32 vs FP32, and ampkit's Engine.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, help="images per step (default 256; 2 with --smoke)")
    parser.add_argument("--image", type=int, help="image side in pixels (default 224; 32 with --smoke)")
    parser.add_argument("--width", type=int, help="stem channels: 64 is ResNet-50 (default; 8 with --smoke)")
    parser.add_argument("--steps", type=int, help="timed steps per contender per round (default 8 on CUDA, 2 on CPU, 1 with --smoke)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; 2 with --smoke)")
    parser.add_argument("--warmup", type=int, help="untimed steps per contender first, at least 1 (default 3 on CUDA, 1 on CPU or with --smoke)")
    parser.add_argument("--fp32-search", action="store_true", help="cuDNN's algorithm search for the FP32 row too (slow on a GPU: see the notes)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works (CI), not a measurement")
    add_time_limit(parser)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device; run on a GPU machine or pass --device cpu.")
    defaults = {"batch": 2, "image": 32, "width": 8, "steps": 1, "rounds": 2, "warmup": 1} if args.smoke else {
        "batch": 256, "image": 224, "width": 64, "steps": 8 if cuda else 2, "rounds": 3, "warmup": 3 if cuda else 1
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in defaults:
        if getattr(args, key) < 1:
            parser.error(f"--{key} {getattr(args, key)}: must be at least 1.")
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    device = torch.device(args.device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"# cnn_throughput  {date.today()}  torch {torch.__version__}  device {device} ({machine}), {torch.get_num_threads()} threads")
    print(f"# command: python {' '.join(sys.argv if argv is None else ['benchmarks/cnn_throughput.py', *argv])}")
    print(f"# channels_last, SGD momentum 0.9; {args.warmup} warm-up steps, then {args.rounds} rounds of {args.steps} timed steps per "
          "contender (the first right after its warm-up, the others interleaved); medians", flush=True)
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with restored_switches(), on_device:  # events and streams of the chosen GPU, not of GPU 0
        results, source = measure(args, device, Deadline(args.time_limit))
    print("\n# every round: the median step of each contender over all its timed steps\n" + "\n".join(table(results)), flush=True)
    report = {"torch": torch.__version__, "device": str(device), "machine": machine, "model": source, "args": vars(args), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
