"""Remainder masters against fp32 masters: bitwise equality over a real run, the ties that can break it, the cost.

``bf16-true-remainder`` keeps each fp32 master as its bf16 weight plus an int16 remainder and a tie bit (2.125 B/param
between steps instead of 8). The tie bit holds the one case an int16 cannot: a master whose low 16 bits are exactly
0x8000 and that rounds *down* to its even bf16 weight (:mod:`ampkit.policy._remainder_bits`). This script trains a
built-in workload under both policies from the same weights on the same batches, and after every step:

- counts, in the fp32 masters of ``bf16-true-masters``, the values the step changed that land on such a tie: how
  often the tie bit is needed in practice (without it each would come back one fp32 ulp off);
- compares the two runs bit for bit (the losses, the bf16 model, the fp32 masters) and records the first step
  where they differ, if any, and how many master values differ at the end.

It also times the two policies' steps side by side (interleaved, medians) and prints their bytes per parameter
beside the bf16 model, measured from the tensors they hold between steps and inside the step.

    python benchmarks/remainder_masters.py --workload gpt --size small --steps 200
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
from ampkit.bench._runner import to_device
from ampkit.memory._accounting import tensor_bytes
from ampkit.policy._device import cpu_name
from ampkit.policy._remainder_bits import REMAINDER_MAX
from ampkit.workloads import get_workload
from ampkit.workloads._workload import call_model, output_as_float

SMOKE = {"workload": "gpt", "size": "tiny", "steps": 4}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script."""


def saturated_ties(masters: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> int:
    """How many values of ``masters`` that changed since ``before`` need the tie bit (an int16 alone cannot hold them).

    The only remainder int16 cannot hold is +32768: a tie rounded down to its even bf16 neighbour. A value that did
    not change is not counted again: its tie was met (and counted) when it was made.
    """
    count = 0
    for name, m in masters.items():
        bits = m.view(torch.int32)
        high = m.to(torch.bfloat16).float().view(torch.int32)
        changed = bits != before[name].view(torch.int32)
        count += int(((bits - high > REMAINDER_MAX) & changed).sum())
    return count


class Run:
    """One policy's engine over the workload, stepping batch by batch and timing each step."""

    def __init__(self, policy: str, workload: Any, model: torch.nn.Module) -> None:
        if workload.channels_last:  # as the bench trains it: the masters must keep this layout
            model = model.to(memory_format=torch.channels_last)
        self.engine = ampkit.Engine(policy, clip_grad_norm=workload.clip_grad_norm)
        self.model, self.opt = self.engine.setup(model, workload.optimizer(model.parameters()))
        self.workload = workload
        self.times: list[float] = []

    def step(self, i: int) -> torch.Tensor:
        x, y = to_device(self.workload.batch(i), torch.device("cpu"), self.workload.channels_last)
        start = time.perf_counter()
        with self.engine.autocast():
            loss = self.workload.loss_fn(output_as_float(call_model(self.model, x)), y)
        self.engine.backward(loss)
        self.engine.step()
        self.times.append(time.perf_counter() - start)
        return loss.detach()

    def masters(self) -> dict[str, torch.Tensor]:
        assert self.engine.masters is not None
        return self.engine.masters.state_dict()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.element_size() == 2 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


def run(workload_name: str, size: str, steps: int) -> dict[str, Any]:
    w = get_workload(workload_name, size=size)
    torch.manual_seed(0)
    fp32, rem = Run("bf16-true-masters", w, copy.deepcopy(w.model)), Run("bf16-true-remainder", w, copy.deepcopy(w.model))
    n16 = sum(p.numel() for p in fp32.model.parameters() if p.dtype == torch.bfloat16)
    inside: list[int] = []
    rem.opt.register_step_pre_hook(lambda *_: inside.append(tensor_bytes(rem.engine.masters.tensors())))  # type: ignore[union-attr]
    ties, first_diff = 0, None
    before = fp32.masters()
    for i in range(steps):
        # Dropout draws the same masks in both runs: each step starts from the same generator state.
        state = torch.get_rng_state()
        a = fp32.step(i)
        torch.set_rng_state(state)
        b = rem.step(i)
        now = fp32.masters()
        ties += saturated_ties(now, before)
        before = now
        same = _same(a, b) and all(_same(p, q) for p, q in zip(fp32.model.parameters(), rem.model.parameters()))
        if first_diff is None and not same:
            first_diff = i + 1
    ma, mb = fp32.masters(), rem.masters()
    differing = sum(int((ma[k].view(torch.int32) != mb[k].view(torch.int32)).sum()) for k in ma)
    return {
        "workload": w.name, "size": size, "steps": steps, "params_bf16": n16,
        "ties": ties, "tie_rate": ties / (n16 * steps), "first_diff_step": first_diff, "masters_differing": differing,
        "bytes_between": {"bf16-true-masters": tensor_bytes(fp32.engine.masters.tensors()) / n16,  # type: ignore[union-attr]
                          "bf16-true-remainder": tensor_bytes(rem.engine.masters.tensors()) / n16},  # type: ignore[union-attr]
        "bytes_inside_step": max(inside) / n16,
        "step_s": {"bf16-true-masters": statistics.median(fp32.times[1:]), "bf16-true-remainder": statistics.median(rem.times[1:])},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="gpt")
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    command = f"python benchmarks/remainder_masters.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# remainder masters  {date.today()}  torch {torch.__version__}  cpu ({cpu_name()}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    r = run(args.workload, args.size, args.steps)
    print(f"# {r['workload']} {r['size']}: {r['params_bf16'] / 1e6:.2f} M bf16 parameters, {r['steps']} steps, the two runs alternating step by step")
    same = "bitwise equal at every step" if r["first_diff_step"] is None else f"first differ after step {r['first_diff_step']}"
    print(f"ties met (held by the tie bit): {r['ties']} ({r['tie_rate']:.2e} per value per step); the runs are {same}; "
          f"fp32 masters differing at the end: {r['masters_differing']}")
    print("| policy | masters' bytes/param between steps | inside the step | step time (median) |")
    print("| --- | ---: | ---: | ---: |")
    for name in ("bf16-true-masters", "bf16-true-remainder"):
        inside = 8.0 if name == "bf16-true-masters" else r["bytes_inside_step"]
        print(f"| {name} | {r['bytes_between'][name]:.3f} | {inside:.3f} | {r['step_s'][name] * 1e3:.1f} ms |")
    ratio = r["step_s"]["bf16-true-remainder"] / r["step_s"]["bf16-true-masters"]
    print(f"remainder step time / fp32 masters': {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
