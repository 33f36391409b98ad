"""What ``Engine(numerics=N)`` costs: step time with the numerics sampler against the same engine without it.

Two copies of the same model train side by side on the same batches with the same fused AdamW and clipping,
one with ``numerics=NumericsSampler(every=N)``, in interleaved rounds (order alternating) so drift hits both.
Every step is timed alone. Reported: the median of steps that are not sampled (should match: the sampler only
adds a modulo there), the median of sampled steps (hooks on every module, statistics of every gradient and
activation, one device-to-host transfer), and the amortized overhead over N steps.

    python benchmarks/numerics_sampler.py                       # digits and gpt, size small, N=50
    python benchmarks/numerics_sampler.py --workloads gpt --precision 16-mixed --every 100
    python benchmarks/numerics_sampler.py --device cuda --workload gpt --size large   # the GPU figure
    python benchmarks/numerics_sampler.py --smoke --json rows.json   # tiny gpt, a few steps: checks the script runs

The precision defaults to the mixed policy a user picks on the device: ``16-mixed`` (fp16, loss scaling) on CUDA,
``bf16-mixed`` on the CPU. ``--json`` writes the run's facts and the rows; each row of the Markdown table is printed when it is measured, and
``--time-limit S`` ends the rounds early (after one at least) and skips the workloads not started.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import statistics
import sys
import time
from datetime import date
from typing import Any

import torch

import ampkit
from ampkit.bench._runner import to_device
from ampkit.numerics._sampler import NumericsSampler
from ampkit.policy._device import cpu_name
from ampkit.workloads import get_workload
from ampkit.workloads._workload import call_model, output_as_float
from measured_rows import Deadline, Printer, add_time_limit, attempt

SMOKE = {"size": "tiny", "workloads": "gpt", "every": 4, "rounds": 2}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script."""


def default_precision(device: torch.device) -> str:
    """The mixed policy a user trains with on ``device``: fp16 with loss scaling on CUDA, bf16 on the CPU."""
    return "16-mixed" if device.type == "cuda" else "bf16-mixed"


def trainer(workload: Any, model: torch.nn.Module, precision: str, sampler: NumericsSampler | None):  # type: ignore[no-untyped-def]
    engine = ampkit.Engine(precision, clip_grad_norm=workload.clip_grad_norm, numerics=sampler)
    model, _opt = engine.setup(model, workload.optimizer(model.parameters()))
    model.train()

    on_gpu = next(model.parameters()).is_cuda

    def step(x: Any, y: torch.Tensor) -> float:
        start = time.perf_counter()
        with engine.autocast():
            loss = workload.loss_fn(output_as_float(call_model(model, x)), y)
        engine.backward(loss)
        engine.step()
        if on_gpu:
            torch.cuda.synchronize()  # the step is over when the device is done, not when the host queued it
        return time.perf_counter() - start

    return step


def one(name: str, size: str, precision: str, every: int, rounds: int, device: torch.device, deadline: Deadline | None = None) -> dict[str, Any]:
    """One workload's row: both engines warmed up, then interleaved rounds until the last or the deadline (one at
    least: each round samples once)."""
    w = get_workload(name, size=size)
    batches = [to_device(b, device, w.channels_last) for b in w.train_batches[:every]]
    base = w.model.to(device)
    if w.channels_last:
        base = base.to(memory_format=torch.channels_last)
    steps = {"off": trainer(w, copy.deepcopy(base), precision, None), "on": trainer(w, copy.deepcopy(base), precision, NumericsSampler(every=every))}
    for s in steps.values():  # warm-up: kernel selection, optimizer state
        for b in batches[:3]:
            s(*b)
    times: dict[str, list[float]] = {"off": [], "on": []}
    sampled: list[float] = []
    order = ["off", "on"]
    counter = 3  # optimizer steps taken so far by each engine
    for r in range(rounds):
        if r and deadline is not None and deadline.passed():
            print(f"# {name}: {r} of {rounds} rounds done when the time limit was reached", flush=True)
            break
        for key in order if r % 2 == 0 else order[::-1]:
            for i in range(every):
                t = steps[key](*batches[i % len(batches)])
                step_number = counter + i + 1
                (sampled if key == "on" and step_number % every == 0 else times[key]).append(t)
        counter += every
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    cost = statistics.median(sampled) if sampled else float("nan")
    return {"workload": name, "status": "ok", "off": off, "on": on, "sampled": cost, "amortized": (off * (every - 1) + cost) / (every * off), "n_sampled": len(sampled)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", "--workload", default="digits,gpt")
    p.add_argument("--size", default="small")
    p.add_argument("--precision", default=None, help="default: 16-mixed on CUDA, bf16-mixed on the CPU")
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and the rows here")
    add_time_limit(p)
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    precision = args.precision or default_precision(device)
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/numerics_sampler.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# numerics sampler  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# size {args.size}, {precision}, sample every {args.every} steps, {args.rounds} interleaved rounds of {args.every} steps per engine")
    deadline = Deadline(args.time_limit)
    emit = Printer().table(HEAD, row_line)
    rows = []
    for name in (n.strip() for n in args.workloads.split(",") if n.strip()):
        late = deadline.passed()
        row = {"workload": name, "status": "skipped", "reason": late} if late else attempt(functools.partial(one, name, args.size, precision, args.every, args.rounds, device, deadline), device)
        row.setdefault("workload", name)
        rows.append(row)
        emit(row)
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "command": command, "size": args.size,
                 "precision": precision, "every": args.every, "rounds": args.rounds}  # fmt: skip
        rows_out = [{k: v if not (isinstance(v, float) and not math.isfinite(v)) else None for k, v in r.items()} for r in rows]
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, "rows": rows_out}, f, indent=1, allow_nan=False)
    return 0 if all(r["status"] != "failed" for r in rows) else 1


HEAD = "| workload | step, no sampler | step not sampled | sampled step | sampled / plain | amortized over N |\n| --- | ---: | ---: | ---: | ---: | ---: |"


def row_line(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"| {r['workload']} | {r['status']}: {r['reason']} | | | | |"
    return (
        f"| {r['workload']} | {r['off'] * 1e3:.2f} ms | {r['on'] * 1e3:.2f} ms | {r['sampled'] * 1e3:.1f} ms ({r['n_sampled']} samples) "
        f"| {r['sampled'] / r['off']:.1f}x | {r['amortized']:.3f}x |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
