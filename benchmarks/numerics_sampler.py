"""What ``Engine(numerics=N)`` costs: step time with the numerics sampler against the same engine without it.

Two copies of the same model train side by side on the same batches with the same fused AdamW and clipping,
one with ``numerics=NumericsSampler(every=N)``, in interleaved rounds (order alternating) so drift hits both.
Every step is timed alone. Reported: the median of steps that are not sampled (should match: the sampler only
adds a modulo there), the median of sampled steps (hooks on every module, statistics of every gradient and
activation, one device-to-host transfer), and the amortized overhead over N steps.

    python benchmarks/numerics_sampler.py                       # digits and gpt, size small, bf16-mixed, N=50
    python benchmarks/numerics_sampler.py --workloads gpt --precision 16-mixed --every 100
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from datetime import date
from typing import Any

import torch

import ampkit
from ampkit.bench.runner import to_device
from ampkit.bench.workload import call_model, output_as_float
from ampkit.bench.workloads import get_workload
from ampkit.numerics.sampler import NumericsSampler
from ampkit.policy.device import cpu_name


def trainer(workload: Any, model: torch.nn.Module, precision: str, sampler: NumericsSampler | None):  # type: ignore[no-untyped-def]
    engine = ampkit.Engine(precision, clip_grad_norm=workload.clip_grad_norm, numerics=sampler)
    model, opt = engine.setup(model, workload.optimizer(model.parameters()))
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


def one(name: str, size: str, precision: str, every: int, rounds: int, device: torch.device) -> dict[str, Any]:
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
        for key in order if r % 2 == 0 else order[::-1]:
            for i in range(every):
                t = steps[key](*batches[i % len(batches)])
                step_number = counter + i + 1
                (sampled if key == "on" and step_number % every == 0 else times[key]).append(t)
        counter += every
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    cost = statistics.median(sampled) if sampled else float("nan")
    return {"workload": name, "off": off, "on": on, "sampled": cost, "amortized": (off * (every - 1) + cost) / (every * off), "n_sampled": len(sampled)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="digits,gpt")
    p.add_argument("--size", default="small")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"# numerics sampler  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: python benchmarks/numerics_sampler.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# size {args.size}, {args.precision}, sample every {args.every} steps, {args.rounds} interleaved rounds of {args.every} steps per engine")
    print("| workload | step, no sampler | step not sampled | sampled step | sampled / plain | amortized over N |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in (n.strip() for n in args.workloads.split(",") if n.strip()):
        r = one(name, args.size, args.precision, args.every, args.rounds, device)
        print(
            f"| {name} | {r['off'] * 1e3:.2f} ms | {r['on'] * 1e3:.2f} ms | {r['sampled'] * 1e3:.1f} ms ({r['n_sampled']} samples) "
            f"| {r['sampled'] / r['off']:.1f}x | {r['amortized']:.3f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
