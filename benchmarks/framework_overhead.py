"""ampkit inside Lightning (Trainer and Fabric), Hugging Face's Trainer and Accelerate, against each framework's own bf16.

Two tables, every row measured in this one run on this CPU (``benchmarks/framework_runs.py`` holds the runs,
``benchmarks/framework_models.py`` the models).

**Overhead.** Per framework and model (a 2-layer GPT2LMHeadModel, n_embd 128, 64 tokens x batch 8; a 3-conv
BatchNorm CNN, width 32, 3x32x32 x batch 32, channels_last), the framework's native bf16-mixed against the same
framework with ampkit's ``bf16-mixed`` (plugin, Trainer subclass or accelerator): the same weights, data, AdamW
(fused; foreach under Lightning's Trainer, whose own bf16-mixed refuses to clip beside a fused optimizer), clipping to
norm 1.0 by the framework's own call, and seed. Each round builds both sides afresh and trains each ``--warmup`` + ``--steps``
optimizer steps, the two in an order that alternates from round to round, so drift in the machine's load hits both
alike. Every optimizer step is timed by a hook at its start and end inside the framework's own loop; the warm-up
steps are dropped. Columns:

- native (ms), ampkit (ms): the median of every timed step of that side over all rounds (rounds x steps);
- ratio: ampkit (ms) / native (ms), the ratio of those medians (above 1: ampkit's side is slower);
- rounds low-high: the lowest and highest per-round ratio (that round's median ampkit step / its median native
  step): how far the rounds disagree, the noise any overhead must clear;
- losses: "bitwise" when every step's loss of every round equals the native side's of the same round bit for bit,
  else the largest absolute difference; weights: the same for the final weights;
- threads: torch's intra-op threads seen inside the timed steps (``--threads``, default 1).

**Resume.** Per framework, a run of 2 epochs of ``--resume-steps`` steps each (the same GPT, dropout off: Lightning's
checkpoint does not carry the global RNG, so dropout would make its native resume differ for that reason alone)
against a run stopped after epoch 1 at a checkpoint written through the framework's own mechanism and resumed by
fresh objects: natively in bf16 (the control), and with ampkit in ``bf16-mixed``, ``16-mixed`` (an inf forced into a
gradient at step 1, before the checkpoint: the step is skipped and the scale halves) and ``bf16-true-masters`` (fp32
masters in the optimizer); and, the negative control that shows the check can fail, ``bf16-true-masters`` resumed
from its checkpoint with ampkit's state taken out (the fp32 masters' low bits are lost, so the resumed run must differ).
Columns:

- first epoch: the stopped run's losses against the uninterrupted run's first epoch ("bitwise" or the largest
  difference): the two runs are the same until the checkpoint, or the comparison after it means nothing;
- resumed losses, final weights: the resumed epoch's losses and the final weights against the uninterrupted run's;
- ampkit state: the engine's optimizer steps, skipped steps and loss scale, uninterrupted / resumed;
- s: the row's wall time (three runs).

Rows are printed as they are measured; ``--json`` writes them with the machine's details; ``--time-limit S``
reports rows not started by then as skipped; a row that raises is a failed row naming the error. ``--smoke`` runs
tiny models for 1 round (CI: the figures mean nothing there).

    python benchmarks/framework_overhead.py                           # both tables, 1 thread
    python benchmarks/framework_overhead.py --frameworks fabric,accelerate --models gpt --rounds 5
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
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the models are built from configs

import torch
from framework_models import cnn, cnn_data, gpt, gpt_data
from framework_runs import AMPKIT, CHECKPOINT, NATIVE, RUNNERS, STRIP, Job, Run, quiet_frameworks

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
    ('bitwise', 'max |d| 0.00123')
    """
    if "lengths" in d:
        return f"steps differ ({d['lengths'][0]} vs {d['lengths'][1]})"
    return "bitwise" if d["bitwise"] else f"max |d| {d['max_abs']:.3g}"


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


def overhead(framework: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    build, data, batch = models(args)[model]
    runner = RUNNERS[framework]
    times: dict[str, list[list[float]]] = {"native": [], "ampkit": []}
    losses, weights, threads = [], [], set()
    for r in range(args.rounds):
        order = ["native", "ampkit"] if r % 2 == 0 else ["ampkit", "native"]
        runs: dict[str, Run] = {}
        for side in order:
            runs[side] = runner(None if side == "native" else "bf16-mixed", Job(model=build, data=data, batch=batch))
            times[side].append(runs[side].times[args.warmup :])
            threads |= runs[side].threads
        losses.append(difference(runs["ampkit"].losses, runs["native"].losses))
        weights.append(difference(runs["ampkit"].params, runs["native"].params))
    return summarize(times["native"], times["ampkit"]) | {"losses": worst(losses), "weights": worst(weights), "threads": sorted(threads),
                                                          "rounds": args.rounds}


def engine_state(run: Run) -> dict[str, Any] | None:
    e = run.engine
    return None if e is None else {"steps": e.steps, "skipped": e.skipped_steps, "scale": e.scale}


def resume(framework: str, case: str, args: argparse.Namespace) -> dict[str, Any]:
    precision, poison, strip = RESUME_CASES[case]
    # The overhead rows' GPT and batch, dropout off (the module docstring says why)
    if args.smoke:
        batch, build, data = 2, gpt(n_layer=1, n_embd=16, n_head=2, vocab=32, seq=8, dropout=0.0), gpt_data(2 * args.resume_steps, vocab=32, seq=8)
    else:
        batch, build, data = 8, gpt(dropout=0.0), gpt_data(8 * args.resume_steps)
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
    "| framework | model | native | ampkit | native (ms) | ampkit (ms) | ratio | rounds low-high | steps each | losses | weights | threads |\n"
    "|---|---|---|---|---:|---:|---:|---|---:|---|---|---:|"
)
RESUME_HEAD = (
    "| framework | run | checkpoint through | first epoch | resumed losses | final weights | ampkit state (uninterrupted / resumed) | s |\n"
    "|---|---|---|---|---|---|---|---:|"
)


def overhead_line(r: dict[str, Any]) -> str:
    head = f"| {r['framework']} | {r['model']} | `{r['native']}` | `{r['ampkit']}` |"
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


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ampkit inside Lightning, the HF Trainer and Accelerate against each one's own bf16: overhead and resume.")
    parser.add_argument("--frameworks", default=",".join(RUNNERS), help=f"comma-separated, of {', '.join(RUNNERS)}")
    parser.add_argument("--models", default="gpt,cnn", help="comma-separated, of gpt, cnn (the overhead table)")
    parser.add_argument("--parts", default="overhead,resume", help="comma-separated, of overhead, resume")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per overhead row (each builds both sides afresh)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per side per round")
    parser.add_argument("--warmup", type=int, default=5, help="optimizer steps per side per round before the timed ones (dropped)")
    parser.add_argument("--resume-steps", type=int, default=4, help="optimizer steps per epoch in the resume runs (2 epochs; the stop after 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: the steps are small)")
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
    torch.set_num_threads(args.threads)
    quiet_frameworks()
    command = "python " + " ".join(sys.argv if argv is None else ["benchmarks/framework_overhead.py", *argv])
    meta = {"date": str(date.today()), **versions(), "cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(),
            "cores": os.cpu_count(), "load_average_start": os.getloadavg(), "command": command}
    print(f"# framework_overhead  {meta['date']}  torch {meta['torch']}  lightning {meta['lightning']}  transformers {meta['transformers']}  "
          f"accelerate {meta['accelerate']}")
    print(f"# CPU {meta['cpu']} ({', '.join(meta['cpu_flags']) or 'no AMX/AVX512-BF16'}), {meta['cores']} cores, {meta['threads']} torch threads; "
          f"load average {' '.join(f'{x:.2f}' for x in meta['load_average_start'])}")
    print(f"# command: {command}")
    print(f"# {args.rounds} rounds x ({args.warmup} warm-up + {args.steps} timed steps) per side; resume: 2 epochs of {args.resume_steps} steps", flush=True)
    deadline, printer = Deadline(args.time_limit), Printer()
    device = torch.device("cpu")
    rows: dict[str, list[dict[str, Any]]] = {"overhead": [], "resume": []}
    if "overhead" in args.parts:
        emit = printer.table(OVERHEAD_HEAD, overhead_line)
        for model in args.models:
            for fw in args.frameworks:
                row: dict[str, Any] = {"framework": fw, "model": model, "native": NATIVE[fw], "ampkit": AMPKIT[fw].format(p="bf16-mixed")}
                late = deadline.passed()
                row |= {"status": "skipped", "reason": late} if late else attempt(functools.partial(overhead, fw, model, args), device)
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
