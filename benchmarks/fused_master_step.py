"""The optimizer step alone: the fused master step against the unfused one, and against bf16-mixed's step.

The step of a master-weight policy (unscale, inf check, clipping, the fp32 update, the 16-bit copy-back) is timed
on its own, with the parameters of a built-in workload's model (gpt by default) and its optimizer (AdamW, torch's
fused kernel where a row says so), gradient clipping at 1.0 as the workloads do. Each engine gets the same saved
gradients before every timed step, so only ``engine.step()`` is timed; the engines take turns in interleaved
rounds and the medians are compared side by side.

Rows:
- ``bf16-mixed``: fp32 weights, torch's fused AdamW: the step the issue measures the masters against.
- ``<masters>``: the master-weight policy's unfused step (foreach copies, torch's fused AdamW on the masters).
- ``<masters> fused``: ``Engine(fused_step=True)``: the whole step as one compiled region (inductor).

Control: the same gradients go into every step, so the fused and unfused masters must end equal up to rounding;
the largest relative difference is printed. Compile time (the first fused step) is reported apart.

    python benchmarks/fused_master_step.py --size small
    python benchmarks/fused_master_step.py --size large --device cuda --policies bf16-true-masters,16-true-masters
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
from ampkit.bench._runner import to_device
from ampkit.policy._device import cpu_name
from ampkit.workloads import get_workload
from ampkit.workloads._workload import call_model, output_as_float

SMOKE = {"workload": "digits", "size": "small", "rounds": 2, "steps": 2, "backend": "aot_eager"}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script (aot_eager: no C++ compilation)."""


class StepOnly:
    """One engine whose ``engine.step()`` is timed on gradients restored from a saved copy before each step."""

    def __init__(self, label: str, precision: str, fused: Any, workload: Any, model: torch.nn.Module, batch: Any, clip: float | None) -> None:
        self.label = label
        self.engine = ampkit.Engine(precision, clip_grad_norm=clip, fused_step=fused)
        self.model, self.opt = self.engine.setup(model, workload.optimizer(model.parameters()))
        with self.engine.autocast():
            loss = workload.loss_fn(output_as_float(call_model(self.model, batch[0])), batch[1])
        self.engine.backward(loss)
        self.params = [p for p in self.model.parameters() if p.grad is not None]
        self.grads = [p.grad.detach().clone() for p in self.params]
        self.engine.step()  # the first step builds the optimizer's state (unfused in every engine)
        self.sync = torch.cuda.synchronize if self.params[0].is_cuda else (lambda: None)
        self.times: list[float] = []

    def step(self) -> float:
        for p, g in zip(self.params, self.grads):
            p.grad = g.clone()
        self.sync()
        start = time.perf_counter()
        self.engine.step()
        self.sync()  # the step is over when the device is done, not when the host queued it
        return time.perf_counter() - start

    def masters(self) -> list[torch.Tensor]:
        held = self.engine.masters.masters if self.engine.masters is not None else []
        return [m.detach() for m in held]


def run(workload_name: str, size: str, policies: list[str], rounds: int, steps: int, device: torch.device, backend: str | None) -> dict[str, Any]:
    w = get_workload(workload_name, size=size)
    batch = to_device(w.train_batches[0], device, w.channels_last)
    base = w.model.to(device)
    clip = w.clip_grad_norm
    fused_spec: Any = {"backend": backend} if backend else True
    mixed = "bf16-mixed" if device.type == "cpu" or torch.cuda.is_bf16_supported() else "16-mixed"
    engines = [StepOnly(mixed, mixed, False, w, copy.deepcopy(base), batch, clip)]
    compile_s: dict[str, float] = {}
    for policy in policies:
        engines.append(StepOnly(policy, policy, False, w, copy.deepcopy(base), batch, clip))
        fused = StepOnly(f"{policy} fused", policy, fused_spec, w, copy.deepcopy(base), batch, clip)
        compile_s[fused.label] = fused.step()  # the first fused step traces and compiles
        engines[-1].step()  # keep the twins level: each has taken the same number of steps
        engines.append(fused)
    for r in range(rounds):
        for e in engines if r % 2 == 0 else reversed(engines):
            e.times.extend(e.step() for _ in range(steps))
    medians = {e.label: statistics.median(e.times) for e in engines}
    reference = medians[engines[0].label]
    rows = []
    for e in engines:
        row: dict[str, Any] = {"engine": e.label, "step_s": medians[e.label], "vs_mixed": medians[e.label] / reference}
        if e.label.endswith(" fused"):
            twin = next(t for t in engines if t.label == e.label.removesuffix(" fused"))
            row["speedup_vs_unfused"] = medians[twin.label] / medians[e.label]
            row["compile_s"] = compile_s[e.label] - medians[e.label]
            row["masters_max_rel_diff"] = max(
                float((a - b).abs().max() / b.abs().max().clamp(min=1e-12)) for a, b in zip(e.masters(), twin.masters())
            )
            row["fused_calls"] = e.engine.fused_step.calls if e.engine.fused_step is not None else 0
            # A region that failed to compile leaves the run on the unfused step: then this row times that.
            row["fused_failure"] = e.engine.fused_step.failure if e.engine.fused_step is not None else None
        rows.append(row)
    n_params = sum(p.numel() for p in base.parameters())
    return {"workload": workload_name, "size": size, "params": n_params, "tensors": len(list(base.parameters())), "rows": rows, "steps_each": rounds * steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="gpt")
    p.add_argument("--size", default="small")
    p.add_argument("--policies", default=None, help="master-weight policies (default: bf16-true-masters; on CUDA also 16-true-masters)")
    p.add_argument("--backend", default=None, help="torch.compile backend of the fused step (default: inductor)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round per engine")
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and the rows here")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    device = torch.device(args.device)
    policies = [s.strip() for s in (args.policies or ("bf16-true-masters,16-true-masters" if device.type == "cuda" else "bf16-true-masters")).split(",") if s.strip()]
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/fused_master_step.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# fused master step  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    result = run(args.workload, args.size, policies, args.rounds, args.steps, device, args.backend)
    print(f"# {result['workload']} {result['size']}: {result['params'] / 1e6:.2f} M parameters in {result['tensors']} tensors; "
          f"{args.rounds} interleaved rounds of {args.steps} steps per engine; backend {args.backend or 'inductor'}")
    if args.json:
        facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "command": command}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**facts, **result}, f, indent=1)
    for r in result["rows"]:
        if r.get("fused_failure"):
            print(f"# {r['engine']}: the region failed to compile ({r['fused_failure']}); its row times the unfused step")
    print("| optimizer step | median | time / bf16-mixed's | fused vs unfused | compile time | masters, max rel. diff fused/unfused |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        fused = "speedup_vs_unfused" in r
        print(
            f"| {r['engine']} | {r['step_s'] * 1e3:.2f} ms | {r['vs_mixed']:.2f}x | "
            + (f"{r['speedup_vs_unfused']:.2f}x | {r['compile_s']:.1f} s | {r['masters_max_rel_diff']:.1e} |" if fused else "| | |")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
