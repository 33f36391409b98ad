"""How well ampkit.memory.estimate predicts a training step's memory, and what a 16-bit policy saves in activations.

For each built-in workload and policy: one `estimate` (fake tensors, nothing allocated) beside one `measure`
(the same two engine steps on real tensors), and on CUDA the allocator's own peak
(torch.cuda.max_memory_allocated). Prints the prediction error of the total and of the peak, and the saved-
activation ratio of each policy to 32-true (the physical limit for 16-bit activations is 0.5).

    python benchmarks/memory_prediction.py                                  # CPU: every CPU policy, small sizes
    python benchmarks/memory_prediction.py --device cuda --size large       # on a GPU: against the allocator too
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date

import torch

from ampkit.bench.workloads import get_workload
from ampkit.cli.env import collect_env
from ampkit.memory import estimate, measure
from ampkit.policy import get_policy, policy_names

MiB = 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", default="small")
    p.add_argument("--workloads", default="digits,segment,gpt,resnet")
    p.add_argument("--precision", help="comma-separated policies (default: every policy the device runs)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    policies = args.precision.split(",") if args.precision else [n for n in policy_names() if get_policy(n).support(device).supported]

    dev = next((d for d in collect_env()["devices"] if d["device"].startswith(device.type)), {"name": device.type})
    print(f"# memory prediction, {date.today()}, torch {torch.__version__}, {dev['name']} ({dev.get('cores', '?')} cores)" if device.type == "cpu"
          else f"# memory prediction, {date.today()}, torch {torch.__version__}, {dev['name']}")
    print(f"# command: python benchmarks/memory_prediction.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print()
    cuda = device.type == "cuda"
    head = "| workload | policy | batch | activations MiB | activ. vs 32-true | total MiB est. | total err | peak MiB est. | peak err |"
    if cuda:
        head += " allocator peak MiB | est. peak vs allocator |"
    head += " estimate s | measure s |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name in args.workloads.split(","):
        w = get_workload(name, size=args.size, seed=0)
        model = w.model.to(memory_format=torch.channels_last) if w.channels_last else w.model
        batch = w.batch(0)
        if w.channels_last:
            batch = tuple(t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t for t in batch)
        options = {"loss_fn": w.loss_fn, "clip_grad_norm": w.clip_grad_norm}
        reference = None
        for policy in policies:
            t0 = time.perf_counter()
            e = estimate(model, batch, w.optimizer, policy, device, **options)
            t1 = time.perf_counter()
            m = measure(model, batch, w.optimizer, policy, device, **options)
            t2 = time.perf_counter()
            if reference is None and e.precision == "32-true":
                reference = m.activations
            ratio = f"{m.activations / reference:.3f}" if reference else "-"
            row = (f"| {name} | {e.precision} | {e.batch_size} | {m.activations / MiB:.2f} | {ratio} | {e.total / MiB:.2f} | "
                   f"{(e.total - m.total) / m.total:+.2%} | {e.peak / MiB:.2f} | {(e.peak - m.peak) / m.peak:+.2%} |")
            if cuda:
                row += f" {m.allocator_peak / MiB:.2f} | {(e.peak - m.allocator_peak) / m.allocator_peak:+.2%} |"
            row += f" {t1 - t0:.2f} | {t2 - t1:.2f} |"
            print(row, flush=True)
    print()
    print("err: (estimate - measure) / measure on this device's real tensors (exact accounting of live storages).")
    if cuda:
        print("allocator: torch.cuda.max_memory_allocated over the measured steps, above what was allocated before.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
