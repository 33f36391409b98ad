"""ampkit inside Lightning (Trainer and Fabric), Hugging Face's Trainer and Accelerate, against each framework's own bf16.

Two tables, every row measured in this one run on this CPU (``benchmarks/framework_runs.py`` holds the runs,
``benchmarks/framework_models.py`` the models, ``benchmarks/lockstep.py`` the stepping in turn).

**Overhead.** Per framework and model (a 2-layer GPT2LMHeadModel, n_embd 128, vocab 512, 64 tokens x batch 8; a
3-conv BatchNorm CNN, width 32, 3x32x32 x batch 32, channels_last; dropout nowhere, see below), the framework's native
bf16-mixed against the same framework with ampkit's ``bf16-mixed`` (plugin, Trainer subclass or accelerator): the same
weights, data, AdamW (fused; foreach under Lightning's Trainer, whose own bf16-mixed refuses to clip beside a fused
optimizer), clipping to norm 1.0 by the framework's own call, and seed. Every optimizer step is timed by a hook at its
start and end inside the framework's own loop.

How: on a shared host one core's speed swings by up to 2x within seconds and differs between cores, so two runs timed
one after the other disagree by tens of percent for no reason of their own. Here the two runs of a row *step in
turn* (:mod:`lockstep`: each in its own thread, exactly one executing at a time, one optimizer step each), both
pinned to one CPU (``--cpu``): each step of one side is timed a few tens of milliseconds from a step of the other, on
the same core. The two runs share the process, so they share the global RNG: dropout is off (its masks would differ).
A round builds both sides afresh and trains each ``--warmup`` + ``--steps`` steps; which side steps first alternates
from round to round; the warm-up steps are dropped. The A/A control rows run the native side against itself the same
way (the second copy where ampkit's side runs): what they show is the method's own bias and noise, the floor under
any overhead the other rows show. Columns:

- native (ms), ampkit (ms): the median of every timed step of that side over all rounds (rounds x steps);
- ratio: ampkit (ms) / native (ms), the ratio of those medians (above 1: ampkit's side is slower);
- rounds low-high: the lowest and highest per-round ratio (that round's median ampkit step / its median native
  step): how far the rounds disagree, the noise any overhead must clear;
- losses: "bitwise" when every step's loss of every round equals the native side's of the same round bit for bit,
  else the largest absolute difference; weights: the same for the final weights;
- threads: torch's intra-op threads seen inside the timed steps (``--threads``, default 1).

**Resume.** Per framework, a run of 2 epochs of ``--resume-steps`` steps each (the overhead rows' GPT) against a run
stopped after epoch 1 at a checkpoint written through the framework's own mechanism and resumed by fresh objects:
natively in bf16 (the control), and with ampkit in ``bf16-mixed``, ``16-mixed`` (an inf forced into a gradient at
step 1, before the checkpoint: the step is skipped and the scale halves) and ``bf16-true-masters`` (fp32 masters in
the optimizer); and, the negative control that shows the check can fail, ``bf16-true-masters`` resumed from its
checkpoint with ampkit's state taken out (the fp32 masters are lost, so the resumed run must differ). Without
dropout the global RNG plays no part (Lightning's checkpoint does not carry it). Columns:

- first epoch: the stopped run's losses against the uninterrupted run's first epoch ("bitwise" or the largest
  difference): the two runs are the same until the checkpoint, or the comparison after it means nothing;
- resumed losses, final weights: the resumed epoch's losses and the final weights against the uninterrupted run's;
- ampkit state: the engine's optimizer steps, skipped steps and loss scale, uninterrupted / resumed;
- s: the row's wall time (three runs).

Rows are printed as they are measured; ``--json`` writes them (every step's time included) with the machine's
details; ``--time-limit S`` reports rows not started by then as skipped; a row that raises is a failed row naming the
error. ``--smoke`` runs tiny models for 1 round (CI: the figures mean nothing there).

    python benchmarks/framework_overhead.py                           # both tables, 1 thread, pinned to the last CPU
    python benchmarks/framework_overhead.py --frameworks fabric,accelerate --models gpt --rounds 4 --no-control
    python benchmarks/framework_overhead.py --smoke --json /tmp/fw.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the models are built from configs

import torch
from framework_models import cnn, cnn_data, gpt, gpt_data
from framework_runs import AMPKIT, CHECKPOINT, NATIVE, RUNNERS, STRIP, Job, Run, quiet_frameworks
from lockstep import Lockstep

from ampkit.policy._device import cpu_name
from measured_rows import Deadline, Printer, add_time_limit, attempt

RESUME_CASES: dict[str, tuple[str | None, frozenset[int], bool]] = {
    "native bf16 (control)": (None, frozenset(), False),
    "ampkit bf16-mixed": ("bf16-mixed", frozenset(), False),
    "ampkit 16-mixed, inf at step 1": ("16-mixed", frozenset({1}), False),
    "ampkit bf16-true-masters": ("bf16-true-masters", frozenset(), False),
    # the negative control: the same checkpoint less ampkit's state must not resume bit for bit, or the check is blind
    "ampkit bf16-true-masters, ampkit state removed": ("bf16-true-masters", frozenset(), True),
}
"""Resume rows: name -> (ampkit policy or None for the framework's own bf16, steps given an inf, ampkit state removed)."""


# ---------------------------------------------------------------------------------------------------- comparisons
def difference(a: Sequence[float] | Sequence[torch.Tensor], b: Sequence[float] | Sequence[torch.Tensor]) -> dict[str, Any]:
    """Whether two loss lists (or weight lists) are equal bit for bit, and their largest absolute difference.

    >>> difference([1.0, 2.0], [1.0, 2.0])
    {'bitwise': True, 'max_abs': 0.0}
    >>> difference([torch.ones(2)], [torch.tensor([1.0, 1.5])])
    {'bitwise': False, 'max_abs': 0.5}
    >>> difference([1.0], [1.0, 2.0])
    {'bitwise': False, 'max_abs': nan, 'lengths': (1, 2)}
    """
    if len(a) != len(b):
        return {"bitwise": False, "max_abs": float("nan"), "lengths": (len(a), len(b))}
    if not a:
        return {"bitwise": True, "max_abs": 0.0}
    if isinstance(a[0], torch.Tensor):
        same = all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))  # type: ignore[union-attr,arg-type]
        worst = max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))  # type: ignore[union-attr]
        return {"bitwise": same, "max_abs": worst}
    return {"bitwise": list(a) == list(b), "max_abs": max(abs(x - y) for x, y in zip(a, b))}  # type: ignore[operator]


def worst(diffs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' differences as one: bitwise only when every round is, and the largest difference of any."""
    out = {"bitwise": all(d["bitwise"] for d in diffs), "max_abs": max(d["max_abs"] for d in diffs)}
    lengths = [d["lengths"] for d in diffs if "lengths" in d]
    return out | ({"lengths": lengths[0]} if lengths else {})


def fmt_diff(d: dict[str, Any]) -> str:
    """A difference as its table cell.

    >>> fmt_diff({"bitwise": True, "max_abs": 0.0}), fmt_diff({"bitwise": False, "max_abs": 0.00123})
    ('bitwise', 'max diff 0.00123')
    """
    if "lengths" in d:
        return f"steps differ ({d['lengths'][0]} vs {d['lengths'][1]})"
    return "bitwise" if d["bitwise"] else f"max diff {d['max_abs']:.3g}"  # no "|": the cell sits in a markdown table


def summarize(native: Sequence[Sequence[float]], ampkit: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Medians of every timed step per side (seconds, over all rounds), their ratio, and each round's ratio.

    >>> s = summarize([[1.0, 1.0], [2.0, 2.0]], [[1.1, 1.1], [2.0, 2.0]])
    >>> round(s["ratio"], 6), s["round_ratios"], s["low"], s["high"]
    (1.033333, [1.1, 1.0], 1.0, 1.1)
    """
    pooled_native, pooled_ampkit = [t for r in native for t in r], [t for r in ampkit for t in r]
    ratios = [round(statistics.median(b) / statistics.median(a), 12) for a, b in zip(native, ampkit)]
    native_s, ampkit_s = statistics.median(pooled_native), statistics.median(pooled_ampkit)
    return {"native_ms": 1e3 * native_s, "ampkit_ms": 1e3 * ampkit_s, "ratio": ampkit_s / native_s, "round_ratios": ratios,
            "low": min(ratios), "high": max(ratios), "steps_each": len(pooled_native)}


# ---------------------------------------------------------------------------------------------------- the two measurements
def models(args: argparse.Namespace) -> dict[str, tuple[Any, Any, int]]:
    """Each model's factory, one epoch's data for the overhead rounds, and its batch."""
    rows = args.warmup + args.steps
    if args.smoke:
        return {"gpt": (gpt(n_layer=1, n_embd=16, n_head=2, vocab=32, seq=8), gpt_data(2 * rows, vocab=32, seq=8), 2),
                "cnn": (cnn(width=4), cnn_data(2 * rows, size=8), 2)}
    return {"gpt": (gpt(), gpt_data(8 * rows), 8), "cnn": (cnn(), cnn_data(32 * rows), 32)}


def in_lockstep(framework: str, job: Callable[[tuple[Lockstep, str]], Job], other: str | None, first: str, args: argparse.Namespace) -> dict[str, Run]:
    """The framework's native bf16 run (in a worker thread) and ``other`` (in this thread) stepping in turn
    (:mod:`lockstep`), ``first`` stepping first. ``other`` runs in the main thread: AmpkitTrainer's save-on-preemption
    watch, whose per-step check is part of what is measured, runs only there (signals reach no other thread)."""
    runner, lock = RUNNERS[framework], Lockstep(["native", "other"], first=first, steps=args.warmup + args.steps)
    runs: dict[str, Run] = {}
    errors: list[BaseException] = []

    def native() -> None:
        torch.set_num_threads(args.threads)
        try:
            runs["native"] = runner(None, job((lock, "native")))
        except BaseException as error:  # noqa: BLE001 - raised again in the main thread, as the row's failure
            errors.append(error)
            lock.abort()

    worker = threading.Thread(target=native, name="native side", daemon=True)
    worker.start()
    try:
        lock.wait_ready("native")  # its setup done before this side's starts (Accelerate's state is one per process)
        runs["other"] = runner(other, job((lock, "other")))
    except BaseException:
        lock.abort()
        worker.join()
        if errors:
            raise errors[0] from None  # the native side failed first: its error is the cause
        raise
    worker.join()
    if errors:
        raise errors[0]
    return runs


def overhead(framework: str, model: str, args: argparse.Namespace, other: str | None = "bf16-mixed") -> dict[str, Any]:
    """One row: ``--rounds`` pairs of fresh runs in lockstep, the side stepping first alternating; ``other=None`` is the
    A/A control (the native run against itself)."""
    build, data, batch = models(args)[model]
    times: dict[str, list[list[float]]] = {"native": [], "other": []}
    losses, weights, threads = [], [], set()
    for r in range(args.rounds):
        first = "native" if r % 2 == 0 else "other"
        runs = in_lockstep(framework, lambda lockstep: Job(model=build, data=data, batch=batch, lockstep=lockstep), other, first, args)
        for side, run in runs.items():
            times[side].append(run.times[args.warmup :])
            threads |= run.threads
        losses.append(difference(runs["other"].losses, runs["native"].losses))
        weights.append(difference(runs["other"].params, runs["native"].params))
    return summarize(times["native"], times["other"]) | {"losses": worst(losses), "weights": worst(weights), "threads": sorted(threads),
                                                         "rounds": args.rounds, "times_native": times["native"], "times_other": times["other"]}


def engine_state(run: Run) -> dict[str, Any] | None:
    e = run.engine
    return None if e is None else {"steps": e.steps, "skipped": e.skipped_steps, "scale": e.scale}


def resume(framework: str, case: str, args: argparse.Namespace) -> dict[str, Any]:
    precision, poison, strip = RESUME_CASES[case]
    if args.smoke:  # the overhead rows' GPT and batch
        batch, build, data = 2, gpt(n_layer=1, n_embd=16, n_head=2, vocab=32, seq=8), gpt_data(2 * args.resume_steps, vocab=32, seq=8)
    else:
        batch, build, data = 8, gpt(), gpt_data(8 * args.resume_steps)
    runner = RUNNERS[framework]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fw_resume_") as tmp:
        job = functools.partial(Job, model=build, data=data, batch=batch, epochs=2, poison=poison)
        whole = runner(precision, job())
        first = runner(precision, job(stop_epoch=1, save_to=Path(tmp) / "checkpoint"))
        if strip:
            STRIP[framework](first.checkpoint)  # type: ignore[arg-type]
        resumed = runner(precision, job(start_epoch=1, resume_from=first.checkpoint))
    k = args.resume_steps
    return {"first_epoch": difference(first.losses, whole.losses[:k]), "resumed_losses": difference(resumed.losses, whole.losses[k:]),
            "final_weights": difference(resumed.params, whole.params), "state_whole": engine_state(whole),
            "state_resumed": engine_state(resumed), "wall_s": time.perf_counter() - started}


# ---------------------------------------------------------------------------------------------------- output
OVERHEAD_HEAD = (
    "| framework | model | native | ampkit (or the A/A control) | native (ms) | ampkit (ms) | ratio | rounds low-high | steps each | losses | weights | threads |\n"
    "|---|---|---|---|---:|---:|---:|---|---:|---|---|---:|"
)
RESUME_HEAD = (
    "| framework | run | checkpoint through | first epoch | resumed losses | final weights | ampkit state (uninterrupted / resumed) | s |\n"
    "|---|---|---|---|---|---|---|---:|"
)


def overhead_line(r: dict[str, Any]) -> str:
    ours = r["ampkit"] if r.get("control") else f"`{r['ampkit']}`"
    head = f"| {r['framework']} | {r['model']} | `{r['native']}` | {ours} |"
    if r["status"] != "ok":
        return f"{head} {r['status']}: {r['reason']} | | | | | | | |"
    return (f"{head} {r['native_ms']:.2f} | {r['ampkit_ms']:.2f} | {r['ratio']:.3f} | {r['low']:.3f}-{r['high']:.3f} | {r['steps_each']} "
            f"| {fmt_diff(r['losses'])} | {fmt_diff(r['weights'])} | {','.join(map(str, r['threads']))} |")


def fmt_state(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """The engine's counters of the uninterrupted run and of the resumed one, as a table cell.

    >>> fmt_state({"steps": 8, "skipped": 1, "scale": 32768.0}, {"steps": 8, "skipped": 1, "scale": 32768.0})
    'steps 8/8, skipped 1/1, scale 32768/32768'
    """
    if a is None or b is None:
        return "-"
    text = f"steps {a['steps']}/{b['steps']}, skipped {a['skipped']}/{b['skipped']}"
    return text + (f", scale {a['scale']:g}/{b['scale']:g}" if a["scale"] is not None and b["scale"] is not None else "")


def resume_line(r: dict[str, Any]) -> str:
    head = f"| {r['framework']} | {r['case']} | {CHECKPOINT[r['framework']]} |"
    if r["status"] != "ok":
        return f"{head} {r['status']}: {r['reason']} | | | | |"
    return (f"{head} {fmt_diff(r['first_epoch'])} | {fmt_diff(r['resumed_losses'])} | {fmt_diff(r['final_weights'])} "
            f"| {fmt_state(r['state_whole'], r['state_resumed'])} | {r['wall_s']:.1f} |")


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in set(flags) if f in ("amx_bf16", "amx_tile", "avx512_bf16"))


def versions() -> dict[str, str]:
    import accelerate
    import lightning
    import transformers

    return {"torch": torch.__version__, "lightning": lightning.__version__, "transformers": transformers.__version__, "accelerate": accelerate.__version__}


def pin(cpu: int | None) -> int | None:
    """Pin this process (and the threads it starts) to one CPU: the two sides of a row then share one core's speed, which
    on a shared host differs between cores (the lockstep module's numbers). Returns the CPU, or None where not pinned."""
    if cpu == -1 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if cpu is None else cpu
    if chosen not in allowed:
        raise SystemExit(f"framework_overhead: --cpu {cpu}: this process may run on CPUs {allowed}; choose one of them, or -1 for no pinning.")
    os.sched_setaffinity(0, {chosen})
    return chosen


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ampkit inside Lightning, the HF Trainer and Accelerate against each one's own bf16: overhead and resume.")
    parser.add_argument("--frameworks", default=",".join(RUNNERS), help=f"comma-separated, of {', '.join(RUNNERS)}")
    parser.add_argument("--models", default="gpt,cnn", help="comma-separated, of gpt, cnn (the overhead table)")
    parser.add_argument("--parts", default="overhead,resume", help="comma-separated, of overhead, resume")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per overhead row (each builds both sides afresh; who steps first alternates)")
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per side per round")
    parser.add_argument("--warmup", type=int, default=5, help="optimizer steps per side per round before the timed ones (dropped)")
    parser.add_argument("--resume-steps", type=int, default=4, help="optimizer steps per epoch in the resume runs (2 epochs; the stop after 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: the steps are small)")
    parser.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU (default: the last one it may run on); -1: no pinning")
    parser.add_argument("--no-control", dest="control", action="store_false", help="leave out the A/A rows (the native run against itself)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 1 round: checks the script works (CI), not a measurement")
    parser.add_argument("--json", help="also write the results to this file")
    add_time_limit(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps, args.warmup, args.resume_steps = 1, 2, 1, 2
    for key in ("rounds", "steps", "resume_steps", "threads"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} {getattr(args, key)}: must be at least 1.")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup}: must be 0 or more.")
    for key, known in (("frameworks", list(RUNNERS)), ("models", ["gpt", "cnn"]), ("parts", ["overhead", "resume"])):
        chosen = [v for v in getattr(args, key).split(",") if v]
        unknown = [v for v in chosen if v not in known]
        if unknown or not chosen:
            parser.error(f"--{key} {getattr(args, key)!r}: choose from {', '.join(known)} (comma-separated).")
        setattr(args, key, chosen)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    threads, affinity = torch.get_num_threads(), os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(args.threads)
    pinned = pin(args.cpu)
    try:
        return measure(args, pinned, argv)
    finally:  # as it was, for a caller in the same process (the tests)
        torch.set_num_threads(threads)
        if affinity is not None:
            os.sched_setaffinity(0, affinity)


def measure(args: argparse.Namespace, pinned: int | None, argv: list[str] | None) -> dict[str, Any]:
    quiet_frameworks()
    command = "python " + " ".join(sys.argv if argv is None else ["benchmarks/framework_overhead.py", *argv])
    meta = {"date": str(date.today()), **versions(), "cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(),
            "cores": os.cpu_count(), "pinned_cpu": pinned, "load_average_start": os.getloadavg(), "command": command}
    print(f"# framework_overhead  {meta['date']}  torch {meta['torch']}  lightning {meta['lightning']}  transformers {meta['transformers']}  "
          f"accelerate {meta['accelerate']}")
    print(f"# CPU {meta['cpu']} ({', '.join(meta['cpu_flags']) or 'no AMX/AVX512-BF16'}), {meta['cores']} cores, {meta['threads']} torch threads, "
          f"{'pinned to CPU ' + str(pinned) if pinned is not None else 'not pinned'}; load average {' '.join(f'{x:.2f}' for x in meta['load_average_start'])}")
    print(f"# command: {command}")
    print(f"# {args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed steps) per side, in lockstep; resume: 2 epochs of "
          f"{args.resume_steps} steps", flush=True)
    deadline, printer = Deadline(args.time_limit), Printer()
    device = torch.device("cpu")
    rows: dict[str, list[dict[str, Any]]] = {"overhead": [], "resume": []}
    if "overhead" in args.parts:
        emit = printer.table(OVERHEAD_HEAD, overhead_line)
        for model in args.models:
            for fw in args.frameworks:
                for other in ["bf16-mixed", None] if args.control else ["bf16-mixed"]:
                    label = AMPKIT[fw].format(p=other) if other else "the same again (A/A control)"
                    row: dict[str, Any] = {"framework": fw, "model": model, "native": NATIVE[fw], "ampkit": label, "control": other is None}
                    late = deadline.passed()
                    row |= {"status": "skipped", "reason": late} if late else attempt(functools.partial(overhead, fw, model, args, other), device)
                    rows["overhead"].append(row)
                    emit(row)
    if "resume" in args.parts:
        emit = printer.table(RESUME_HEAD, resume_line)
        for fw in args.frameworks:
            for case in RESUME_CASES:
                row = {"framework": fw, "case": case}
                late = deadline.passed()
                row |= {"status": "skipped", "reason": late} if late else attempt(functools.partial(resume, fw, case, args), device)
                rows["resume"].append(row)
                emit(row)
    meta["load_average_end"] = os.getloadavg()
    print(f"\n# load average at the end {' '.join(f'{x:.2f}' for x in meta['load_average_end'])}", flush=True)
    report = {**meta, "args": vars(args), **rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
