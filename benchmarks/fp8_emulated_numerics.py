"""fp8's numerics on any machine: a built-in workload trained under bf16-mixed and under torchao's fp8 emulation.

No CPU has fp8 matmuls, but torchao's emulation casts to fp8 exactly as the GPU kernels' inputs are cast, so the
training trajectory is fp8's (the matmul accumulates in higher precision than a tensor core may). This script
trains one workload from the same weights on the same batches under ``32-true``, ``bf16-mixed`` and both fp8
recipes (every Linear layer in fp8: ``layers="all"``, since at CPU batch sizes the roofline would convert none),
and prints the final training loss, the eval metric and the largest per-step loss difference from ``bf16-mixed``
beside bf16-mixed's own from ``32-true``: what fp8 costs in accuracy, measured against a control. Step times are
torchao's emulation, not fp8's speed, and are not printed.

    python benchmarks/fp8_emulated_numerics.py --workload gpt --size small
    python benchmarks/fp8_emulated_numerics.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from datetime import date
from typing import Any

import torch

import ampkit
from ampkit._util.model_io import batch_loss, run_batch, to_device
from ampkit.policy import FP8Rowwise, FP8Tensorwise
from ampkit.policy._device import cpu_name
from ampkit.workloads import get_workload

SMOKE = {"workload": "gpt", "size": "tiny", "steps": 2}


def train(workload: Any, policy: Any, steps: int) -> dict[str, Any]:
    """``steps`` optimizer steps of a copy of the workload's model under ``policy``; the losses and the eval metric."""
    torch.manual_seed(0)
    model = copy.deepcopy(workload.model)
    engine = ampkit.Engine(policy, clip_grad_norm=workload.clip_grad_norm)
    model, _ = engine.setup(model, workload.optimizer(model.parameters()))
    losses = []
    for i in range(steps):
        batch = to_device(workload.train_batches[i % len(workload.train_batches)], torch.device("cpu"))
        with engine.autocast():
            loss = batch_loss(model, batch, workload.loss_fn)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    metric = workload.metric()
    model.eval()
    with torch.no_grad(), engine.autocast():
        for batch in workload.eval_batches:
            metric.update(*run_batch(model, batch))
    values = metric.compute()
    converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    return {"losses": losses, "metric": metric.name, "value": values[metric.name], "fp8_layers": converted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the workload's)")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    parser.add_argument("--smoke", action="store_true", help=f"seconds: {SMOKE}")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workload, args.size, args.steps = SMOKE["workload"], SMOKE["size"], SMOKE["steps"]
    workload = get_workload(args.workload, args.size)
    steps = args.steps or workload.steps
    policies = {
        "32-true": "32-true",
        "bf16-mixed": "bf16-mixed",
        "fp8-tensorwise": FP8Tensorwise(emulate=True, layers="all"),
        "fp8-rowwise": FP8Rowwise(emulate=True, layers="all"),
    }
    runs = {name: train(workload, policy, steps) for name, policy in policies.items()}
    control, fp32 = runs["bf16-mixed"], runs["32-true"]
    print(f"{args.workload} ({args.size}), {steps} steps, CPU: {cpu_name()}, torch {torch.__version__}, {date.today()}")
    print(f"{'policy':16} {'fp8 layers':>10} {'final loss':>10} {control['metric']:>12} {'max |dloss| vs bf16-mixed':>26}")
    for name, r in runs.items():
        diff = max(abs(a - b) for a, b in zip(r["losses"], control["losses"]))
        print(f"{name:16} {r['fp8_layers']:>10} {r['losses'][-1]:>10.4f} {r['value']:>12.4f} {diff:>26.4f}")
    start = control["losses"][0]
    print(f"bf16-mixed's loss fell {start - control['losses'][-1]:.4f}; bf16-mixed vs 32-true differ by at most "
          f"{max(abs(a - b) for a, b in zip(fp32['losses'], control['losses'])):.4f} per step.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"workload": args.workload, "size": args.size, "steps": steps, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
