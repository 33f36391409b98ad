"""``ampkit tune`` on every built-in workload and a Hugging Face GPT-2 built from a config: what the tuned
configuration gains over the start, over the best single lever and over hand-combined levers, measured side by side.

Per workload:

1. **The tune** (:func:`ampkit.tuning.tune_workload`, as ``ampkit tune -w NAME --budget B`` runs it; on a busy machine
   it measures at the threads left free, and so does everything below, its start included; digits-aug
   through its DataLoader, so the loader stage runs too). Its wall time, its winner and the winner's accuracy guard
   (gap to fp32, fp32's own noise, the tolerance) are what the tune itself reports.
2. **The single levers**, one wave (the tune's own interleaved trials, :func:`ampkit.tuning._wave.measure_wave`):
   the start with one lever changed: each precision policy the CPU runs fast, compile (whole model), torch's threads
   (the counts the tune's threads stage tries) and, for a model with Conv2d, channels_last. The fastest whose accuracy guard passes (a policy the tune did not judge is
   judged here against the tune's own fp32 reference) is **the best single lever**.
3. **The comparison**, one more wave, side by side: the start, the best single lever, the **hand-combined levers**
   (the recipe a practitioner reaches for: bf16-mixed autocast + torch.compile of the whole model + channels_last
   for a convolutional model; and the best single policy + compile, when that policy is not bf16-mixed), and the
   **tuned** configuration. The fastest hand combination is the one compared with.

The table's figures, one definition each:

- **start ms**: the start's median step (fp32, the user's batch) in the comparison wave;
- **x start**: a configuration's speed-up over the start: the start's median step over its own, compile time
  amortised over ``--run-steps`` (as the tune ranks), with its 95% bootstrap interval
  (:func:`ampkit.bench.speedup_interval`), all from the comparison wave. The compile time amortised is the
  configuration's first, cold compile in this process (each workload starts with an empty inductor cache): a later
  trial of the same graph finds the cache warm and would favour whatever the tune compiled before;
- **tuned / best single**, **tuned / hand**: the other's amortised median step over the tuned one's, with the
  interval, from the same wave: above 1, the tuned configuration is faster; an interval holding 1, no difference
  beyond the noise;
- **acc gap**: the tuned configuration's figure worse than fp32's (negative: better), in the workload's metric
  (accuracy, IoU, perplexity, or the final training loss), beside fp32's **noise** (its figure's move when only
  the batch order changes) and the **tolerance** the guard held it to;
- **tune s**: the tune's wall time, the budget included.

The loader's gain (digits-aug) is not in the comparison: the waves time steps on batches already in memory, as the
tune's waves do; the tune's loader stage measures it through the DataLoader, and its row says what it chose.

    python benchmarks/tune_workloads.py                                   # every workload, 180 s budget each
    python benchmarks/tune_workloads.py --workloads digits,gpt --budget 120 --json /tmp/tune.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from ampkit.bench import BenchData, speedup_interval
from ampkit.policy import get_policy, policy_names
from ampkit.profile import usable_cores, workload_loader
from ampkit.tuning import Candidate, TuneResult, WaveSettings, tune_workload
from ampkit.tuning._guard import GuardResult, Reference, judge
from ampkit.tuning._trials import Trial, cold_compiles
from ampkit.tuning._wave import measure_wave
from ampkit.workloads import Workload, get_workload, workload_from

WORKLOADS = ("digits", "digits-aug", "segment", "gpt", "resnet", "hf-gpt2")
COMPARE_WAVES = WaveSettings(rounds=8, chunk=3)
"""The comparison's trials: 24 timed steps each, twice the tune's own, for tighter intervals."""


def hf_gpt2(seed: int = 0) -> Workload:
    """A Hugging Face GPT-2 built from a config (4 layers, width 256, 64 tokens, vocabulary 2048, batch 16; about
    3.7M weights), random-initialised, on deterministic counting sequences: the model computes its own loss from
    ``labels``, batches are dicts passed as ``model(**batch)``. Nothing is downloaded. 40 steps: the accuracy
    guard's runs, three of them (fp32, fp32 reordered, a finalist), fit a 180 s budget beside the trials."""
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab, seq, rows = 2048, 64, 16
    config = GPT2Config(vocab_size=vocab, n_positions=seq, n_layer=4, n_embd=256, n_head=4, bos_token_id=0, eos_token_id=0, use_cache=False)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"

    def batches(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(count):
            start = torch.randint(0, vocab, (rows, 1), generator=g)
            stride = torch.randint(1, 8, (rows, 1), generator=g)
            ids = (start + stride * torch.arange(seq)) % vocab
            out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
        return out

    return workload_from(model, BenchData(train=batches(40, seed), eval=batches(4, seed + 1)), steps=40, warmup=5, model_spec="hf-gpt2")


def build(name: str, seed: int) -> tuple[Workload, Any]:
    """The workload and the DataLoader it is read through (None: its batches are in memory)."""
    if name == "hf-gpt2":
        return hf_gpt2(seed), None
    workload = get_workload(name, size="small", seed=seed)
    return workload, (workload_loader(workload) if workload.samples is not None else None)


def fast_policies() -> list[str]:
    cpu = torch.device("cpu")
    return [n for n in policy_names() if n != "32-true" and get_policy(n).support(cpu).fast]


def amortised(t: Trial, run_steps: int, compiles: dict[str, float]) -> list[float]:
    """The trial's step times with its cold compile time spread over ``run_steps`` steps."""
    shift = compiles.get(Candidate.from_dict(t.candidate).numerics_key, t.compile_s or 0.0) / run_steps
    return [s + shift for s in t.step_times_s]


def ratio(reference: list[float], mine: list[float]) -> dict[str, Any]:
    """median(reference) / median(mine), with its bootstrap interval."""
    ci = speedup_interval(reference, mine)
    return {"ratio": statistics.median(reference) / statistics.median(mine), "low": ci[0] if ci else None, "high": ci[1] if ci else None}


def guard_of(c: Candidate, result: TuneResult, workload: Workload, run_steps: int, seed: int) -> GuardResult | None:
    """``c``'s accuracy guard: the tune's, else judged now against the tune's own fp32 reference; None for fp32."""
    if c.policy == "32-true" and not c.channels_last:
        return None
    if c.numerics_key in result.guard:
        return result.guard[c.numerics_key]
    ref = result.reference
    if ref is None:
        return None
    return judge(workload, c, ref if isinstance(ref, Reference) else Reference.from_dict(ref), torch.device("cpu"), seed=seed)


def compare(name: str, budget: float, run_steps: int, seed: int, log: Any) -> dict[str, Any]:
    workload, loader = build(name, seed)
    cpu = torch.device("cpu")
    # A fresh inductor cache per workload: every compile time below starts cold, as a new machine's would.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"tune-{name}-inductor-")
    t0 = time.monotonic()
    result = tune_workload(workload, cpu, budget=budget, run_steps=run_steps, seed=seed, loader=loader, command=f"tune_workloads {name}")
    tune_s = time.monotonic() - t0
    # The start as the tune measured against it: on a busy machine, at the threads left free (the levers below are
    # then measured there too: at torch's own threads their steps would show the contention, not the lever).
    start, tuned = result.baseline, dataclasses.replace(result.winner, loader=())
    convs = any(isinstance(m, torch.nn.Conv2d) for m in workload.model.modules())
    print(f"[{name}] tuned in {tune_s:.0f} s: {tuned.describe(start)} ({result.winner_reason})", file=log, flush=True)

    singles = [dataclasses.replace(start, policy=p) for p in fast_policies()] + [dataclasses.replace(start, compile="model")]
    singles += [dataclasses.replace(start, channels_last=True)] if convs and not start.channels_last else []
    # torch's threads, as the tune's threads stage varies them (on a busy machine the lever that pays most alone).
    cores = usable_cores()
    singles += [dataclasses.replace(start, threads=n) for n in sorted({1, max(1, cores // 2), cores} - {start.threads or torch.get_num_threads()})]
    first = measure_wave(workload, "single", start, singles, cpu, settings=COMPARE_WAVES, seed=seed)
    compiles = cold_compiles(result.trials + first)
    ranked = sorted((t for t in first if t.role == "candidate" and t.status == "ok"), key=lambda t: statistics.median(amortised(t, run_steps, compiles)))
    best_single, guards = None, {}
    for t in ranked:
        c = Candidate.from_dict(t.candidate)
        g = guard_of(c, result, workload, run_steps, seed)
        guards[c.key] = g
        if g is None or g.passed:
            best_single = c
            break
        print(f"[{name}] single lever {c.describe(start)} fails the accuracy guard: {g.reason}", file=log, flush=True)
    best_single = best_single or start
    best_policy = next(
        (
            Candidate.from_dict(t.candidate).policy
            for t in ranked
            if Candidate.from_dict(t.candidate).policy != "32-true" and (guards.get(t.key) is None or guards[t.key].passed)
        ),
        "bf16-mixed",
    )
    hands = [dataclasses.replace(start, policy="bf16-mixed", compile="model", channels_last=convs or start.channels_last)]
    if best_policy != "bf16-mixed":
        hands.append(dataclasses.replace(hands[0], policy=best_policy))
    wave = list(dict.fromkeys([best_single, *hands, tuned]))
    second = measure_wave(workload, "compare", start, [c for c in wave if c != start], cpu, settings=COMPARE_WAVES, seed=seed)
    by_key = {t.key: t for t in second}
    compiles = cold_compiles(result.trials + first + second)
    base = by_key[start.key].step_times_s

    def row(c: Candidate) -> dict[str, Any]:
        t = by_key[c.key]
        if t.status != "ok":
            return {"key": c.key, "change": c.describe(start), "status": t.status, "error": t.error}
        return {
            "key": c.key,
            "change": c.describe(start),
            "status": "ok",
            "median_ms": statistics.median(t.step_times_s) * 1e3,
            "compile_s": compiles.get(c.numerics_key),
            "x_start": ratio(base, amortised(t, run_steps, compiles)),
        }

    hand_rows = [row(h) for h in hands]
    best_hand = max(
        (h for h, r in zip(hands, hand_rows) if r["status"] == "ok"),
        key=lambda h: statistics.median(base) / statistics.median(amortised(by_key[h.key], run_steps, compiles)),
        default=None,
    )
    tuned_t = by_key[tuned.key]
    out: dict[str, Any] = {
        "workload": name,
        "description": workload.description,
        "tune_s": tune_s,
        "budget": budget,
        "run_steps": run_steps,
        "start_ms": statistics.median(base) * 1e3,
        "tuned": row(tuned),
        "best_single": row(best_single),
        "hands": hand_rows,
        "winner_reason": result.winner_reason,
        "stages": result.stages,
        "timings": result.timings,
        "loader_trials": result.loader_trials,
    }
    if tuned_t.status == "ok" and best_single != tuned and by_key[best_single.key].status == "ok":
        out["tuned_vs_single"] = ratio(amortised(by_key[best_single.key], run_steps, compiles), amortised(tuned_t, run_steps, compiles))
    elif best_single == tuned:
        out["tuned_vs_single"] = {"ratio": 1.0, "low": None, "high": None, "same": True}
    if tuned_t.status == "ok" and best_hand is not None and best_hand != tuned:
        out["tuned_vs_hand"] = ratio(amortised(by_key[best_hand.key], run_steps, compiles), amortised(tuned_t, run_steps, compiles))
        out["best_hand"] = best_hand.describe(start)
    elif best_hand == tuned:
        out["tuned_vs_hand"] = {"ratio": 1.0, "low": None, "high": None, "same": True}
        out["best_hand"] = best_hand.describe(start)
    g = result.guard.get(tuned.numerics_key)
    ref = result.reference
    out["guard"] = (
        {"metric": g.metric, "gap": g.gap, "noise": g.noise, "tolerance": g.tolerance, "passed": g.passed}
        if g is not None
        else {
            "metric": ref.metric if ref else None,
            "gap": 0.0,
            "noise": ref.noise if ref else None,
            "tolerance": ref.tolerance if ref else None,
            "passed": True,
            "start": True,
        }
    )
    return out


def fmt_ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    if r.get("same"):
        return "same config"
    ci = f" [{r['low']:.2f}-{r['high']:.2f}]" if r.get("low") is not None else ""
    return f"{r['ratio']:.2f}x{ci}"


def compiled(row: dict[str, Any]) -> str:
    return f" (compile {row['compile_s']:.0f} s)" if row.get("compile_s") else ""


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| workload | tune s | start ms | tuned (x start) | best single lever (x start) | best hand combination (x start) | "
        "tuned / best single | tuned / hand | acc gap (noise, tolerance) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        t, s = r["tuned"], r["best_single"]
        hand = max((h for h in r["hands"] if h["status"] == "ok"), key=lambda h: h["x_start"]["ratio"], default=None)
        g = r["guard"]
        gap = "-" if g.get("start") else f"{g['gap']:+.3g} {g['metric']} ({g['noise']:.3g}, {g['tolerance']:.3g})"
        lines.append(
            f"| {r['workload']} | {r['tune_s']:.0f} | {r['start_ms']:.1f} | {t['change']}: {fmt_ratio(t.get('x_start'))}{compiled(t)} | "
            f"{s['change']}: {fmt_ratio(s.get('x_start'))} | {hand['change'] + ': ' + fmt_ratio(hand['x_start']) if hand else '-'} | "
            f"{fmt_ratio(r.get('tuned_vs_single'))} | {fmt_ratio(r.get('tuned_vs_hand'))} | {gap} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--budget", type=float, default=180.0, help="each tune's wall-clock budget, seconds (default 180)")
    parser.add_argument("--run-steps", type=int, default=1000, help="the run length compile time is amortised over (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every row's figures here")
    args = parser.parse_args()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    print(
        f"# tune_workloads: torch {torch.__version__}, {torch.get_num_threads()} threads, {date.today()}, budget {args.budget:g} s, "
        f"compile amortised over {args.run_steps} steps",
        flush=True,
    )
    rows = []
    for name in names:
        rows.append(compare(name, args.budget, args.run_steps, args.seed, sys.stderr))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1, default=str))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
