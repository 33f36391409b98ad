"""Eager against ``Engine(compile=...)`` per policy on the built-in workloads: step time, speed-up, compile time.

Each policy trains two engines from the same weights on the same batches: one eager, one compiled. The first
compiled steps pay the compilation; their time, less a steady step's, is reported as the compile time. Then the
two are timed in interleaved rounds (warm-up excluded) and the medians compared. As a control, the loss after the
last step of each is printed side by side: compilation must not change what is computed beyond rounding.

    python benchmarks/compile_speed.py --workloads gpt,resnet --size small
    python benchmarks/compile_speed.py --compile regional          # each repeated block instead of the whole model
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from datetime import date
from typing import Any

import torch

import ampkit
from ampkit.bench.runner import to_device
from ampkit.policy.device import cpu_name
from ampkit.workloads import get_workload
from ampkit.workloads.workload import call_model, output_as_float

SMOKE = {"workloads": "digits", "size": "small", "precision": "32-true,bf16-mixed", "rounds": 2, "steps": 2, "backend": "aot_eager"}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script (aot_eager: no C++ compilation)."""

COMPILE_STEPS = 3
"""Steps counted as compilation: the first step compiles forward and backward; later ones may recompile once."""


def default_precisions(device: torch.device) -> str:
    return "32-true,16-mixed,bf16-mixed,bf16-true-masters" if device.type == "cuda" else "32-true,bf16-mixed,bf16-true-masters"


def trainer(workload: Any, model: torch.nn.Module, precision: str, compile_spec: Any):  # type: ignore[no-untyped-def]
    engine = ampkit.Engine(precision, clip_grad_norm=workload.clip_grad_norm, compile=compile_spec)
    model, _ = engine.setup(model, workload.optimizer(model.parameters()))
    model.train()
    on_gpu = next(model.parameters()).is_cuda

    def step(x: Any, y: torch.Tensor) -> tuple[float, float]:
        start = time.perf_counter()
        with engine.autocast():
            loss = workload.loss_fn(output_as_float(call_model(model, x)), y)
        engine.backward(loss)
        engine.step()
        if on_gpu:
            torch.cuda.synchronize()  # the step is over when the device is done, not when the host queued it
        return time.perf_counter() - start, float(loss.detach())

    return step


def one(name: str, size: str, precision: str, compile_spec: Any, rounds: int, steps: int, device: torch.device) -> dict[str, Any]:
    w = get_workload(name, size=size)
    batches = [to_device(b, device, w.channels_last) for b in w.train_batches[: max(steps, COMPILE_STEPS)]]
    base = w.model.to(device)
    if w.channels_last:
        base = base.to(memory_format=torch.channels_last)
    runs = {"eager": trainer(w, copy.deepcopy(base), precision, None), "compiled": trainer(w, copy.deepcopy(base), precision, compile_spec)}
    first: dict[str, float] = {}
    for key, run in runs.items():  # the first steps: kernel selection eager, compilation compiled
        first[key] = sum(run(*batches[i % len(batches)])[0] for i in range(COMPILE_STEPS))
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    last: dict[str, float] = {}
    for r in range(rounds):
        for key in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            for i in range(steps):
                t, last[key] = runs[key](*batches[i % len(batches)])
                times[key].append(t)
    eager, compiled = statistics.median(times["eager"]), statistics.median(times["compiled"])
    return {
        "workload": name,
        "precision": precision,
        "eager_s": eager,
        "compiled_s": compiled,
        "speedup": eager / compiled,
        "compile_s": first["compiled"] - COMPILE_STEPS * compiled,
        "loss_eager": last["eager"],
        "loss_compiled": last["compiled"],
        "steps_each": len(times["eager"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="gpt,resnet")
    p.add_argument("--size", default="small")
    p.add_argument("--precision", default=None, help="comma-separated policies (default: 32-true and the device's fast ones)")
    p.add_argument("--compile", default="true", choices=["true", "regional"], help="the whole model, or each repeated block")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: torch's, inductor)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="steps per round per engine")
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and the rows here")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    device = torch.device(args.device)
    spec: Any = {"regional": args.compile == "regional"}
    if args.backend:
        spec["backend"] = args.backend
    precisions = [s.strip() for s in (args.precision or default_precisions(device)).split(",") if s.strip()]
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/compile_speed.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# compile speed  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# size {args.size}, compile={args.compile} backend={args.backend or 'inductor'}, {args.rounds} interleaved rounds of {args.steps} steps per engine")
    rows = [one(n.strip(), args.size, prec, spec, args.rounds, args.steps, device) for n in args.workloads.split(",") if n.strip() for prec in precisions]
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "command": command, "size": args.size, "compile": args.compile}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, "rows": rows}, f, indent=1)
    print("| workload | policy | eager step | compiled step | speed-up | compile time | loss eager / compiled (last step) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(
            f"| {r['workload']} | {r['precision']} | {r['eager_s'] * 1e3:.1f} ms | {r['compiled_s'] * 1e3:.1f} ms | {r['speedup']:.2f}x "
            f"| {r['compile_s']:.1f} s | {r['loss_eager']:.4f} / {r['loss_compiled']:.4f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
