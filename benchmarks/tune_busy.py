"""``ampkit tune`` on a quiet and on a busy machine: does it answer within its budget, and say when it was disturbed?

For each workload and budget the tune runs twice, as ``ampkit tune`` runs it (:func:`ampkit.tuning.tune_workload`;
digits-aug through its DataLoader): on the machine as it is (**quiet**: nothing else of ours runs), and **loaded**,
beside ``--load`` CPU-bound processes (``while True: pass`` each, started a second before the tune and stopped after
it: what a second job on a shared box does). The workloads: ``ampkit tune``'s built-in ones (size small, as
``benchmarks/tune_workloads.py`` runs them), a Hugging Face GPT-2 built from a config (``hf-gpt2``) and **tiny-gpt**,
a user's own 2-layer, 128-wide GPT given as ``--model``/``--data`` would give it (outputs ``[B, T, V]``, targets
``[B, T]``; :func:`tiny_gpt`).

The table's figures, one definition each:

- **tune s**: the tune's wall time; **over**: how far past the budget it ended (0 when within);
- **rows**: configurations measured with a speed-up interval (the table's rows that are neither cut nor failed);
- **winner**: what the tune recommends, with its speed-up over the start and the 95% interval the tune reports (from
  the confirmation wave where there was one), and the rounds that figure rests on; ``refused: N s`` when the budget was
  refused upfront with a minimum of N s;
- **machine**: what the report said of the machine: ``busy`` (it measured other processes taking at least half a
  core), ``free threads N`` (torch's threads would have oversubscribed the cores: the search ran at N, against the
  start at N), ``dropped R`` (rounds dropped because the control drifted, over all waves), ``disturbed W`` (waves
  that could not replace them, shown but not judged); ``-``: nothing said.

    python benchmarks/tune_busy.py                                         # every workload, 60/90/180 s, quiet and loaded
    python benchmarks/tune_busy.py --workloads tiny-gpt,digits --budgets 90 --json /tmp/busy.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tune_workloads import build

from ampkit.tuning import TuneResult, rows, tune_workload
from ampkit.workloads import BenchData, Workload, workload_from

WORKLOADS = ("tiny-gpt", "digits", "digits-aug", "segment", "gpt", "resnet", "hf-gpt2")


def tiny_gpt(seed: int = 0) -> Workload:
    """A user's own tiny GPT: 2 pre-norm layers, width 128, 4 heads, 64 tokens, vocabulary 512, batch 16, on
    deterministic counting sequences; outputs ``[B, T, V]`` beside targets ``[B, T]`` (ampkit's default loss
    flattens them)."""
    from torch import nn

    vocab, seq, rows_, width = 512, 64, 16, 128

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), 1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(seq, width))
            self.blocks = nn.Sequential(Block(), Block())
            self.head = nn.Linear(width, vocab)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(self.emb(idx) + self.pos))

    def batches(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (count, rows_, 1), generator=g)
        tokens = (starts + torch.arange(seq + 1)) % vocab
        return [(t[:, :-1], t[:, 1:]) for t in tokens]

    torch.manual_seed(seed)
    return workload_from(GPT(), BenchData(train=batches(40, seed), eval=batches(4, seed + 1)), steps=40, warmup=5, model_spec="tiny-gpt")


def _burn() -> None:
    while True:
        pass


def loaded(n: int) -> list[multiprocessing.Process]:
    """``n`` CPU-bound processes, running until terminated."""
    procs = [multiprocessing.get_context("spawn").Process(target=_burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    return procs


def machine_said(result: TuneResult) -> str:
    """What the report said of the machine (see the module's docstring)."""
    said = []
    if result.machine.get("busy_at_probe") or any((w.get("others_cores") or 0) >= 0.5 for w in result.waves):
        said.append("busy")
    if result.machine.get("oversubscribed"):
        said.append(f"free threads {result.machine.get('free_threads')}")
    dropped = sum(w.get("dropped_rounds", 0) for w in result.waves)
    disturbed = sum(1 for w in result.waves if w.get("disturbed"))
    said += [f"dropped {dropped}"] if dropped else []
    said += [f"disturbed {disturbed}"] if disturbed else []
    return ", ".join(said) or "-"


def one(name: str, budget: float, load: int, run_steps: int, seed: int) -> dict[str, Any]:
    workload, loader = (tiny_gpt(seed), None) if name == "tiny-gpt" else build(name, seed)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"busy-{name}-inductor-")  # cold compiles, as a new machine's
    procs = loaded(load) if load else []
    t0 = time.monotonic()
    try:
        result = tune_workload(workload, torch.device("cpu"), budget=budget, run_steps=run_steps, seed=seed, loader=loader,
                               command=f"tune_busy {name}")
    except ValueError as exc:
        minimum = re.search(r"pass --budget (\d+)", str(exc))
        return {"workload": name, "budget": budget, "load": load, "tune_s": time.monotonic() - t0, "refused": int(minimum.group(1)) if minimum else None,
                "error": str(exc)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()
    table = rows(result)
    measured = [r for r in table if r["verdict"] not in ("cut", "failed")]
    won = next((r for r in table if r["verdict"] == "winner"), None)
    trial_rounds = {t.key: t.rounds for t in result.trials}
    return {
        "workload": name, "budget": budget, "load": load, "tune_s": result.elapsed_s, "rows": len(measured),
        "winner": result.winner.describe(result.start), "winner_reason": result.winner_reason,
        "speedup": won["speedup"] if won else None, "interval": won["interval"] if won else None,
        "rounds": trial_rounds.get(won["key"]) if won else None, "machine": machine_said(result), "notes": result.notes,
        "waves": result.waves, "probe": result.machine,
    }


def fmt(row: dict[str, Any]) -> str:
    if "error" in row:
        refused = f"refused: {row['refused']} s" if row.get("refused") else f"error: {row['error'][:60]}"
        return f"| {row['workload']} | {row['budget']:g} | {'loaded' if row['load'] else 'quiet'} | {row['tune_s']:.0f} | 0 | - | {refused} | - |"
    over = max(0.0, row["tune_s"] - row["budget"])
    ci = row["interval"]
    won = row["winner"] if row["speedup"] is None else f"{row['winner']}: {row['speedup']:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
    if row["rounds"]:
        won += f", {row['rounds']} rounds"
    return (f"| {row['workload']} | {row['budget']:g} | {'loaded' if row['load'] else 'quiet'} | {row['tune_s']:.0f} | {over:.1f} | "
            f"{row['rows']} | {won} | {row['machine']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--budgets", default="60,90,180")
    parser.add_argument("--load", type=int, default=2, help="CPU-bound processes beside the loaded runs (default 2)")
    parser.add_argument("--loaded-only", action="store_true", help="only the loaded runs")
    parser.add_argument("--run-steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"# tune_busy: torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, {date.today()}, "
          f"load average at the start {os.getloadavg()[0]:.2f}; loaded = {args.load} CPU-bound processes beside the tune", flush=True)
    print("| workload | budget s | machine | tune s | over s | rows | winner (x start [95%], rounds) | the report said |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    out = []
    for name in args.workloads.split(","):
        for budget in (float(b) for b in args.budgets.split(",")):
            for load in (args.load,) if args.loaded_only else (0, args.load):
                row = one(name, budget, load, args.run_steps, args.seed)
                out.append(row)
                print(fmt(row), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
