"""How well ampkit.memory.estimate predicts a training step's memory, and what a 16-bit policy saves in activations.

For each built-in workload and policy: one `estimate` (fake tensors, nothing allocated) beside one `measure`
(the same two engine steps on real tensors), and on CUDA the allocator's own peak
(torch.cuda.max_memory_allocated). Prints the prediction error of the total and of the peak, and the saved-
activation ratio of each policy to 32-true (the physical limit for 16-bit activations is 0.5). The Markdown table
is printed a row at a time, each the moment it is measured; --json writes its rows. ``--time-limit S``: rows not started
by then are reported skipped (the GPU suite's step).

    python benchmarks/memory_prediction.py                                  # CPU: every CPU policy, small sizes
    python benchmarks/memory_prediction.py --device cuda --size large       # on a GPU: against the allocator too
    python benchmarks/memory_prediction.py --smoke                          # tiny sizes, 32-true and the mixed policy
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from ampkit.cli._env import collect_env
from ampkit.memory import estimate, measure
from ampkit.memory._workspaces import create_library_workspaces
from ampkit.policy import get_policy, policy_names
from ampkit.workloads import get_workload
from measured_rows import Deadline, Printer, add_time_limit, attempt

MiB = 2**20


def _policies(args: argparse.Namespace, device: torch.device) -> list[str]:
    if args.precision:
        return args.precision.split(",")
    if args.smoke:  # the reference and the mixed policy a user of this device picks
        return ["32-true", "16-mixed" if device.type == "cuda" else "bf16-mixed"]
    return [n for n in policy_names() if get_policy(n).support(device).supported]


def _row(name: str, e: Any, m: Any, reference: int | None, seconds: tuple[float, float]) -> dict[str, Any]:
    return {
        "workload": name, "policy": e.precision, "batch": e.batch_size, "activations": m.activations,
        "activations_vs_32_true": m.activations / reference if reference else None,
        "total_estimate": e.total, "total_measure": m.total, "total_error": (e.total - m.total) / m.total,
        "peak_estimate": e.peak, "peak_measure": m.peak, "peak_error": (e.peak - m.peak) / m.peak,
        "allocator_peak": m.allocator_peak,
        "peak_vs_allocator": (e.peak - m.allocator_peak) / m.allocator_peak if m.allocator_peak else None,
        "attention": e.attention, "estimate_s": seconds[0], "measure_s": seconds[1],
    }


def _head(cuda: bool) -> str:
    head = "| workload | policy | batch | activations MiB | activ. vs 32-true | total MiB est. | total err | peak MiB est. | peak err |"
    if cuda:
        head += " allocator peak MiB | est. peak vs allocator |"
    head += " estimate s | measure s |"
    return head + "\n|" + "---|" * (head.count("|") - 1)


def _line(r: dict[str, Any], cuda: bool) -> str:
    if r["status"] != "ok":
        return f"| {r['workload']} | {r['policy']} | {r['status']}: {r['reason']} |" + " |" * (_head(cuda).count("|") // 2 - 4)
    ratio = f"{r['activations_vs_32_true']:.3f}" if r["activations_vs_32_true"] is not None else "-"
    line = (f"| {r['workload']} | {r['policy']} | {r['batch']} | {r['activations'] / MiB:.2f} | {ratio} | "
            f"{r['total_estimate'] / MiB:.2f} | {r['total_error']:+.2%} | {r['peak_estimate'] / MiB:.2f} | {r['peak_error']:+.2%} |")
    if cuda:
        line += f" {r['allocator_peak'] / MiB:.2f} | {r['peak_vs_allocator']:+.2%} |"
    return line + f" {r['estimate_s']:.2f} | {r['measure_s']:.2f} |"


def _prepared(name: str, size: str) -> tuple[Any, Any, Any]:
    """The workload's model and first batch, in channels_last where the workload trains so."""
    w = get_workload(name, size=size, seed=0)
    model = w.model.to(memory_format=torch.channels_last) if w.channels_last else w.model
    batch = w.batch(0)
    if w.channels_last:
        batch = tuple(t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t for t in batch)
    return model, batch, w


def _one(name: str, size: str, policy: str, device: torch.device, workload: list[Any], reference: int | None) -> dict[str, Any]:
    """One row: the estimate and the measurement of ``policy`` on the workload, built into ``workload`` at first use."""
    if not workload:
        workload.append(_prepared(name, size))
    model, batch, w = workload[0]
    options = {"loss_fn": w.loss_fn, "clip_grad_norm": w.clip_grad_norm}
    t0 = time.perf_counter()
    e = estimate(model, batch, w.optimizer, policy, device, **options)
    t1 = time.perf_counter()
    m = measure(model, batch, w.optimizer, policy, device, **options)
    t2 = time.perf_counter()
    return _row(name, e, m, reference, (t1 - t0, t2 - t1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", help="workload size: tiny, small (default) or large (a GPU)")
    p.add_argument("--workloads", help="comma-separated workloads (default: digits,segment,gpt,resnet; --smoke: digits,segment,gpt)")
    p.add_argument("--precision", help="comma-separated policies (default: every policy the device runs)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 32-true and the device's mixed policy, no resnet: seconds, for CI")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the rows (bytes, errors as fractions) to PATH")
    add_time_limit(p)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    size = args.size or ("tiny" if args.smoke else "small")
    # resnet's real step takes most of a CPU smoke run's time: the smoke run leaves it out unless asked for.
    workloads = (args.workloads or ("digits,segment,gpt" if args.smoke else "digits,segment,gpt,resnet")).split(",")
    policies = _policies(args, device)
    cuda = device.type == "cuda"

    dev = next((d for d in collect_env()["devices"] if d["device"].startswith(device.type)), {"name": device.type})
    print(f"# memory prediction, {date.today()}, torch {torch.__version__}, {dev['name']} ({dev.get('cores', '?')} cores)" if not cuda
          else f"# memory prediction, {date.today()}, torch {torch.__version__}, {dev['name']}")
    print(f"# command: python benchmarks/memory_prediction.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print("# err: (estimate - measure) / measure on this device's real tensors (exact accounting of live storages).")
    if cuda:
        print("# allocator: torch.cuda.max_memory_allocated over the measured steps, above what was allocated before "
              "(cuBLAS workspaces created beforehand, so no row carries them).")
    create_library_workspaces(device)
    deadline = Deadline(args.time_limit)
    emit = Printer().table(_head(cuda), lambda r: _line(r, cuda))
    rows: list[dict[str, Any]] = []
    for name in workloads:
        reference = None
        workload: list[Any] = []  # built at its first row that starts, once
        for policy in policies:
            late = deadline.passed()
            one = functools.partial(_one, name, size, policy, device, workload, reference)
            row = {"workload": name, "policy": policy, "status": "skipped", "reason": late} if late else attempt(one, device)
            row.setdefault("workload", name)
            row.setdefault("policy", policy)
            if reference is None and row["status"] == "ok" and row["policy"] == "32-true":
                reference = row["activations"]
            rows.append(row)
            emit(row)
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "name": dev["name"], "size": size, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
