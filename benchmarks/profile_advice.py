"""``ampkit profile`` checked against controls: does it put a slow dataset's time in the data phase, find a per-step
``.item()`` at its line, and does its input-pipeline advice make the step faster when applied? And what does
profiling cost?

Four measurements on ``digits-aug`` (the digits CNN fed through a CPU-heavy per-sample augmentation):

1. **Attribution.** The profile of the workload against the profile of its control, the same workload with the
   augmentation removed (``augment=False``). The data phase must grow by what the augmentation costs when timed
   alone (the dataset's ``__getitem__`` and collation for a batch, with and without it), and no other phase may.
2. **The advice, applied.** The profile's trials pick a DataLoader setting; the loop is then trained with the
   loader as given and with the advised one, interleaved over rounds (the order flips every round), each round
   a fresh epoch so a worker pool's start is paid as in training. Median step time and speed-up.
3. **Syncs.** A user loop logging ``loss.item()`` every step, profiled through the Python API: the site must be
   found at its line once per step. The same loop with and without the read-back, interleaved: on a GPU the
   read-back drains the queue each step; on a CPU it costs nothing (there is no queue), which is shown too.
4. **Overhead.** The median step of each profiling window (phases timed; syncs counted; torch.profiler) against
   the loop's plain step (the trials' loader as given, unprofiled).

    python benchmarks/profile_advice.py                        # CPU, small, bf16-mixed where fast
    python benchmarks/profile_advice.py --device cuda --size large
    python benchmarks/profile_advice.py --smoke                # seconds: checks the script (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

import ampkit
from ampkit import Engine
from ampkit._util.model_io import batch_loss, to_device
from ampkit.policy._device import cpu_name
from ampkit.profile import LoaderSettings, Profiler, loader_variant, profile_workload
from ampkit.profile._run import workload_loader
from ampkit.workloads._digits_aug import build
from measured_rows import Deadline, add_time_limit, attempt

PHASE_ORDER = ("data", "copy", "forward", "backward", "optimizer", "other")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def augmentation_cost(size: str, seed: int, batches: int) -> dict[str, float]:
    """Median seconds to make one batch (``__getitem__`` of each sample, then collation) with and without the
    augmentation: the slow part, timed alone."""
    out = {}
    for augment in (True, False):
        w = build(size, seed=seed, augment=augment)
        ds, b = w.samples, w.items_per_batch
        times = []
        for k in range(batches):
            start = time.perf_counter()
            default_collate([ds[i] for i in range(k * b, (k + 1) * b)])
            times.append(time.perf_counter() - start)
        out["augmented" if augment else "control"] = statistics.median(times)
    return out


def attribution(args: argparse.Namespace, device: torch.device, precision: str) -> dict[str, Any]:
    sizes = {"warmup": args.warmup, "plain_steps": 0, "timed": args.steps, "sync_steps": 0, "trace_steps": 0}
    slow = profile_workload(build(args.size, seed=args.seed), precision, device, trials=False, **sizes)
    control = profile_workload(build(args.size, seed=args.seed, augment=False), precision, device, trials=False, **sizes)
    alone = augmentation_cost(args.size, args.seed, max(3, args.steps // 2))
    return {
        "phases": {p: {"slow_s": slow["phases"][p]["median_s"], "control_s": control["phases"][p]["median_s"]} for p in PHASE_ORDER},
        "step": {"slow_s": slow["step_s"]["median"], "control_s": control["step_s"]["median"]},
        "augmentation_alone_s": alone["augmented"] - alone["control"],
        "batch_alone_s": alone,
    }


def _epoch_step_s(loader: DataLoader[Any], settings: LoaderSettings, step: Any, device: torch.device, steps: int, channels_last: bool) -> float:
    """Mean wall seconds per step over one fresh epoch of ``steps`` steps, the loader's start included."""
    _sync(device)
    start = time.perf_counter()
    n = 0
    for batch in loader:
        step(to_device(batch, device, channels_last, non_blocking=settings.non_blocking))
        n += 1
        if n == steps:
            break
    _sync(device)
    return (time.perf_counter() - start) / n


def advice_applied(args: argparse.Namespace, device: torch.device, precision: str) -> dict[str, Any]:
    w = build(args.size, seed=args.seed)
    profile = profile_workload(
        w, precision, device, warmup=args.warmup, plain_steps=args.plain_steps, timed=args.steps, sync_steps=args.sync_steps, trace_steps=args.trace_steps
    )
    trials = profile["trials"]
    best = max(trials, key=lambda t: t["speedup"])
    given, advised = LoaderSettings(**trials[0]["settings"]), LoaderSettings(**best["settings"])
    _engine, _model, step = _trainer(w, precision, device)
    loader = workload_loader(w)
    samples = None if args.ab_steps is None else args.ab_steps * w.items_per_batch  # None: whole epochs, as trained
    steps = len(loader) if args.ab_steps is None else args.ab_steps
    loaders = {"as given": loader_variant(loader, given, samples=samples), "advised": loader_variant(loader, advised, samples=samples)}
    settings = {"as given": given, "advised": advised}
    _epoch_step_s(loaders["as given"], given, step, device, args.warmup, w.channels_last)  # warm the model up
    times: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in (list(loaders) if r % 2 == 0 else list(loaders)[::-1]):
            with _threads(settings[name].torch_threads):
                times[name].append(_epoch_step_s(loaders[name], settings[name], step, device, steps, w.channels_last))
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "profile": {k: profile[k] for k in ("phases", "step_s", "trials", "advice", "overhead", "syncs", "ops", "device_idle")},
        "advised": best["name"],
        "ab_step_s": medians,
        "ab_speedup": medians["as given"] / medians["advised"],
    }


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` (None: as they are) for the block, as the trial that chose them."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _trainer(w: Any, precision: str, device: torch.device) -> tuple[Engine, torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = copy.deepcopy(w.model).to(device)
    if w.channels_last:
        model = model.to(memory_format=torch.channels_last)
    engine = Engine(precision, clip_grad_norm=w.clip_grad_norm)
    model, _ = engine.setup(model, w.optimizer(model.parameters()))

    def step(batch: Any) -> torch.Tensor:
        with engine.autocast():
            loss = batch_loss(model, batch, w.loss_fn)
        engine.backward(loss)
        engine.step()
        return loss

    return engine, model, step


def syncs(args: argparse.Namespace, device: torch.device, precision: str) -> dict[str, Any]:
    """A loop that logs ``loss.item()`` every step: the profile's site, and the step with and without it."""
    w = build(args.size, seed=args.seed, augment=False)  # the data out of the way: the read-back is the subject
    engine, _model, step = _trainer(w, precision, device)
    batches = [to_device(w.batch(i), device, w.channels_last) for i in range(8)]
    with Profiler(engine, warmup=args.warmup, plain_steps=0, timed=2, sync_steps=args.sync_steps, trace_steps=0) as profiler:
        for i in range(args.warmup + 2 + args.sync_steps):
            loss = step(batches[i % len(batches)])
            logged = loss.item()  # the per-step read-back the profile must find
    found = profiler.result()["syncs"]

    def run(read_back: bool) -> float:
        _sync(device)
        start = time.perf_counter()
        for i in range(args.ab_steps or 20):
            loss = step(batches[i % len(batches)])
            if read_back:
                logged = loss.item()  # noqa: F841
        _sync(device)
        return (time.perf_counter() - start) / (args.ab_steps or 20)

    run(False)
    times: dict[str, list[float]] = {"with .item()": [], "without": []}
    for r in range(args.rounds):
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            times[name].append(run(name == "with .item()"))
    del logged
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"sites": found["sites"], "per_step": found["per_step"], "ab_step_s": medians, "cost": medians["with .item()"] / medians["without"]}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def attribution_markdown(a: dict[str, Any], size: str, precision: str) -> str:
    lines = [
        f"Attribution against the control (augmentation removed), {size}, {precision}, median per step:",
        "", "| phase | slow dataset (ms) | control (ms) | difference (ms) |", "|---|---|---|---|",
    ]
    for p in PHASE_ORDER:
        slow, control = a["phases"][p]["slow_s"], a["phases"][p]["control_s"]
        lines.append(f"| {p} | {_ms(slow)} | {_ms(control)} | {_ms(slow - control)} |")
    lines += [
        f"| **step** | {_ms(a['step']['slow_s'])} | {_ms(a['step']['control_s'])} | {_ms(a['step']['slow_s'] - a['step']['control_s'])} |",
        f"| augmentation timed alone (per batch) | | | {_ms(a['augmentation_alone_s'])} |",
    ]
    return "\n".join(lines)


def advice_markdown(b: dict[str, Any]) -> str:
    lines = [
        "The advice, applied (interleaved rounds, each a fresh epoch, loader start included):", "",
        "| loader | step (ms) | speed-up |", "|---|---|---|",
        f"| as given | {_ms(b['ab_step_s']['as given'])} | 1.00x |",
        f"| advised: {b['advised']} | {_ms(b['ab_step_s']['advised'])} | {b['ab_speedup']:.2f}x |",
        "", "The profile's own trials:", "", "| trial | step (ms) | steady step (ms) | epoch start (ms) | speed-up |", "|---|---|---|---|---|",
    ]
    for t in b["profile"]["trials"]:
        lines.append(f"| {t['name']} | {_ms(t['step_s'])} | {_ms(t['median_step_s'])} | {_ms(t['epoch_start_s'])} | {t['speedup']:.2f}x |")
    lines += ["", "The profiler's own overhead (median step per window):", "", "| window | step (ms) | vs plain |", "|---|---|---|"]
    o = b["profile"]["overhead"]
    plain = o["plain_step_s"]
    for key, name in (("plain_step_s", "plain (unprofiled)"), ("profiled_step_s", "phases timed"), ("sync_step_s", "syncs counted"), ("trace_step_s", "torch.profiler")):
        value = o.get(key)
        lines.append(f"| {name} | {_ms(value)} | {'-' if value is None or not plain else f'{value / plain:.2f}x'} |")
    return "\n".join(lines)


def syncs_markdown(s: dict[str, Any]) -> str:
    site = s["sites"][0] if s["sites"] else None
    return "\n".join([
        "A per-step `loss.item()`:", "",
        "- found: " + ("none" if site is None else f"{site['per_step']:g} per step at {Path(site['where']).name}: `{site['code']}`"),
        f"- step with it {_ms(s['ab_step_s']['with .item()'])} ms, without {_ms(s['ab_step_s']['without'])} ms: {s['cost']:.2f}x",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ampkit profile against controls: attribution, the advice applied, syncs, overhead.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="small", choices=("tiny", "small", "large"))
    parser.add_argument("--precision", help="default: bf16-mixed where it runs fast, else 32-true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--plain-steps", type=int, default=10, help="unprofiled steps, the overhead's reference")
    parser.add_argument("--steps", type=int, default=15, help="steps whose phases are timed")
    parser.add_argument("--sync-steps", type=int, default=5)
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--ab-steps", type=int, help="steps per round of each A/B side (default: a whole epoch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and few steps: checks the script runs")
    parser.add_argument("--json", type=Path)
    add_time_limit(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.warmup, args.plain_steps, args.steps, args.sync_steps, args.trace_steps, args.ab_steps, args.rounds = "tiny", 1, 2, 3, 1, 1, 3, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.precision is None:
        support = ampkit.get_policy("bf16-mixed").support(device)
        args.precision = "bf16-mixed" if support.supported and support.fast else "32-true"
    result: dict[str, Any] = {
        "date": date.today().isoformat(), "torch": torch.__version__, "ampkit": ampkit.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_name()} ({torch.get_num_threads()} threads)",
        "size": args.size, "precision": args.precision,
    }
    print(f"ampkit profile against controls: digits-aug {args.size}, {args.precision}, {result['device']}, torch {torch.__version__}, {result['date']}", flush=True)
    # Each part printed the moment it is measured, most telling first; a part not started by the time limit says so.
    deadline = Deadline(args.time_limit)
    parts = (
        ("attribution", lambda: attribution(args, device, args.precision), lambda r: attribution_markdown(r, args.size, args.precision)),
        ("syncs", lambda: syncs(args, device, args.precision), syncs_markdown),
        ("advice", lambda: advice_applied(args, device, args.precision), advice_markdown),
    )
    for key, work, show in parts:
        late = deadline.passed()
        result[key] = {"status": "skipped", "reason": late} if late else attempt(work, device)
        part = result[key]
        print("\n" + (show(part) if part["status"] == "ok" else f"{key}: {part['status']}: {part['reason']}"), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(result[k]["status"] != "failed" for k in ("attribution", "syncs", "advice")) else 1


if __name__ == "__main__":
    sys.exit(main())
