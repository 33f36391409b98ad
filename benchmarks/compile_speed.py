"""Eager against ``Engine(compile=...)``, per policy and per form, on the built-in workloads: step time, speed-up
with its spread over rounds, compile time.

Each row trains two engines from the same weights on the same batches: one eager, one compiled, either the whole
model (``--compile true``) or each repeated block (``--compile regional``); ``--compile regional,true`` measures both
side by side, a row each, in that order. The first compiled steps pay the compilation; their time, less a steady
step's, is the compile time. Then the two engines are timed in interleaved rounds (warm-up excluded). As a control,
the loss after the last step of each is printed side by side: compilation must not change what is computed beyond
rounding.

The table's figures, one definition each (its column heads say the same):

- eager step, compiled step: the median over every timed step of the row (rounds x steps per engine);
- speed-up: the median over rounds of each round's ratio (that round's median eager step / its median compiled
  step): each round compares the two engines under the same conditions, so drift between rounds cancels;
- per round, lowest-highest: the lowest and the highest of those ratios, how far the rounds disagree: the noise the
  speed-up must clear (it lies between them, where a ratio of the two medians above may not);
- verdict: "faster" or "slower in every round" when every round's ratio is on the same side of 1, else "within
  noise";
- compile time: the first 3 compiled steps less 3 steady compiled steps (a second form in the same process finds
  torch's caches warm: inductor's kernels from the first are reused where the code is the same).

Rows are measured one at a time and each is printed (and written to ``--json``) the moment it is measured;
``--time-limit S`` reports the rows not started by then as skipped, and a row whose compile fails is a failed row
naming the error, the others still measured.

    python benchmarks/compile_speed.py --workloads gpt,resnet --size small
    python benchmarks/compile_speed.py --compile regional,true         # each repeated block, then the whole model
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from typing import Any

import torch

import ampkit
from ampkit.bench._runner import to_device
from ampkit.policy._device import cpu_name
from ampkit.workloads import get_workload, workload_names
from ampkit.workloads._workload import call_model, output_as_float
from measured_rows import Deadline, Printer, add_time_limit, attempt

SMOKE = {"workloads": "gpt", "size": "small", "batch_size": 2, "precision": "bf16-mixed", "compile": "regional,true", "rounds": 2, "steps": 2,
         "backend": "aot_eager"}
"""What ``--smoke`` runs: seconds on a CPU, every code path of the script (both forms: gpt small has two blocks, the
smallest with repeated ones; 2 rows a batch; aot_eager: no C++ compilation)."""

COMPILE_STEPS = 3
"""Steps counted as compilation: the first step compiles forward and backward; later ones may recompile once."""

FORMS = {"true": True, "regional": "regional"}
"""``--compile`` names and the ``Engine(compile=...)`` each stands for."""

Row = dict[str, Any]


def default_precisions(device: torch.device) -> str:
    return "32-true,16-mixed,bf16-mixed,bf16-true-masters" if device.type == "cuda" else "32-true,bf16-mixed,bf16-true-masters"


def trainer(workload: Any, model: torch.nn.Module, precision: str, compile_spec: Any) -> Callable[..., tuple[float, float]]:
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


def speedup_figures(eager_rounds: list[list[float]], compiled_rounds: list[list[float]]) -> Row:
    """The row's timing figures from each engine's step times, a list per round (see the module notes).

    >>> f = speedup_figures([[6.0, 6.0], [6.0, 6.0], [6.0, 6.0]], [[3.0, 3.0], [4.0, 4.0], [5.0, 5.0]])
    >>> f["speedup_rounds"], f["speedup"], f["verdict"]
    ([2.0, 1.5, 1.2], 1.5, 'faster in every round')
    """
    eager = statistics.median(t for r in eager_rounds for t in r)
    compiled = statistics.median(t for r in compiled_rounds for t in r)
    per_round = [statistics.median(e) / statistics.median(c) for e, c in zip(eager_rounds, compiled_rounds)]
    return {
        "eager_s": eager,
        "compiled_s": compiled,
        "speedup": statistics.median(per_round),
        "speedup_rounds": per_round,
        "speedup_min": min(per_round),
        "speedup_max": max(per_round),
        "verdict": verdict(per_round),
        "rounds": len(per_round),
        "steps_each": sum(len(r) for r in eager_rounds),
    }


def verdict(per_round: list[float]) -> str:
    """Faster or slower only when every round says so; a single round has no spread to judge against.

    >>> verdict([1.2, 0.98, 1.1]), verdict([0.8, 0.9]), verdict([1.3])
    ('within noise: the rounds disagree', 'slower in every round', 'one round: no spread to judge')
    """
    if len(per_round) < 2:
        return "one round: no spread to judge"
    if min(per_round) > 1:
        return "faster in every round"
    if max(per_round) < 1:
        return "slower in every round"
    return "within noise: the rounds disagree"


def measure_form(w: Any, base: torch.nn.Module, batches: list[Any], precision: str, form: str, args: argparse.Namespace) -> Row:
    """One row: an eager and a compiled engine from ``base``'s weights, the compile, then interleaved rounds."""
    spec: Any = FORMS[form]
    if args.backend:
        spec = {"backend": args.backend, "regional": form == "regional"}
    runs = {"eager": trainer(w, copy.deepcopy(base), precision, None), "compiled": trainer(w, copy.deepcopy(base), precision, spec)}
    first: dict[str, float] = {}
    for key, run in runs.items():  # the first steps: kernel selection eager, compilation compiled
        first[key] = sum(run(*batches[i % len(batches)])[0] for i in range(COMPILE_STEPS))
    rounds: dict[str, list[list[float]]] = {"eager": [], "compiled": []}
    last: dict[str, float] = {}
    for r in range(args.rounds):
        for key in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            times = []
            for i in range(args.steps):
                t, last[key] = runs[key](*batches[i % len(batches)])
                times.append(t)
            rounds[key].append(times)
    figures = speedup_figures(rounds["eager"], rounds["compiled"])
    return {
        **figures,
        "compile_s": first["compiled"] - COMPILE_STEPS * figures["compiled_s"],
        "loss_eager": last["eager"],
        "loss_compiled": last["compiled"],
    }


HEAD = (
    "| workload | policy | compile | eager step (median) | compiled step (median) | speed-up (median of the rounds' eager / compiled) "
    "| per round, lowest-highest | verdict (per round) | compile time (first 3 steps less 3 steady) | loss eager / compiled (last step) |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"
)
SHOWN = {"true": "True (whole model)", "regional": "'regional'"}


def line(r: Row) -> str:
    lead = f"| {r['workload']} | {r['precision']} | {SHOWN[r['compile']]} |"
    if r["status"] != "ok":
        return f"{lead} {r['status']}: {r['reason']} | | | | | | |"
    return (
        f"{lead} {r['eager_s'] * 1e3:.1f} ms | {r['compiled_s'] * 1e3:.1f} ms | {r['speedup']:.2f}x "
        f"| {r['speedup_min']:.2f}-{r['speedup_max']:.2f}x | {r['verdict']} "
        f"| {r['compile_s']:.1f} s | {r['loss_eager']:.4f} / {r['loss_compiled']:.4f} |"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="gpt,resnet")
    p.add_argument("--size", default="small")
    p.add_argument("--batch-size", type=int, default=None, help="rows per training batch (default: the size's)")
    p.add_argument("--precision", default=None, help="comma-separated policies (default: 32-true and the device's fast ones)")
    p.add_argument("--compile", default="true", help="true (the whole model), regional (each repeated block), or both, comma-separated: a row each")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: torch's, inductor)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10, help="steps per round per engine")
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=f"a tiny run that checks the script works: {SMOKE}")
    p.add_argument("--json", help="also write the run's facts and the rows here (rewritten as each row is measured)")
    add_time_limit(p)
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    args.forms = [f.strip() for f in args.compile.split(",") if f.strip()]
    unknown = [f for f in args.forms if f not in FORMS]
    if unknown or not args.forms:
        p.error(f"--compile {args.compile}: give true (the whole model), regional (each repeated block) or both, e.g. --compile regional,true")
    args.names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    bad = [n for n in args.names if n not in workload_names()]
    if bad:
        p.error(f"--workloads: unknown {', '.join(bad)}; choose from {', '.join(workload_names())}")
    for key in ("rounds", "steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key} {getattr(args, key)}: must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    precisions = [s.strip() for s in (args.precision or default_precisions(device)).split(",") if s.strip()]
    where = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    command = f"python benchmarks/compile_speed.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    print(f"# compile speed  {date.today()}  torch {torch.__version__}  device {device} ({where}), {torch.get_num_threads()} threads")
    print(f"# command: {command}")
    print(f"# size {args.size}, compile={','.join(args.forms)} backend={args.backend or 'inductor'}, "
          f"{args.rounds} interleaved rounds of {args.steps} steps per engine", flush=True)
    facts = {"device": str(device), "device_name": where, "torch": torch.__version__, "command": command, "size": args.size, "batch_size": args.batch_size,
             "compile": ",".join(args.forms), "rounds": args.rounds, "steps": args.steps}
    deadline = Deadline(args.time_limit)
    emit = Printer().table(HEAD, line)
    built: dict[str, tuple[Any, torch.nn.Module, list[Any]]] = {}  # each workload built once, for all its rows

    def measure_row(name: str, precision: str, form: str) -> Row:
        if name not in built:
            w = get_workload(name, size=args.size, batch_size=args.batch_size)
            base = w.model.to(device)
            if w.channels_last:
                base = base.to(memory_format=torch.channels_last)
            built[name] = (w, base, [to_device(b, device, w.channels_last) for b in w.train_batches[: max(args.steps, COMPILE_STEPS)]])
        return measure_form(*built[name], precision, form, args)

    rows: list[Row] = []
    for name in args.names:
        for precision in precisions:
            for form in args.forms:
                row: Row = {"workload": name, "precision": precision, "compile": form}
                late = deadline.passed()
                row |= {"status": "skipped", "reason": late} if late else attempt(partial(measure_row, name, precision, form), device)
                rows.append(row)
                emit(row)
                if args.json:  # a run cut at its limit keeps the rows it measured here too
                    with open(args.json, "w", encoding="utf-8") as f:
                        json.dump({**facts, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
