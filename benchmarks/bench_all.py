"""Run ``ampkit bench`` on every built-in workload and print the Markdown tables BENCHMARKS.md keeps.

    python benchmarks/bench_all.py --out benchmarks/results/cpu                 # run all four, then print
    python benchmarks/bench_all.py --out benchmarks/results/cpu --tables-only   # print from existing results
    python benchmarks/bench_all.py --out benchmarks/results/h100 --size large   # on a GPU

Each workload runs in its own process (``python -m ampkit bench ... --out OUT/<workload>``), so one
workload's allocations cannot inflate the next one's peak RSS. Every figure printed comes from the
results.json that run wrote; nothing is typed in by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ampkit.bench._format import fmt_bytes, fmt_ratio, fmt_seconds
from ampkit.bench._results import BenchResult, RunResult
from ampkit.bench._table import legend_lines

WORKLOADS = ("digits", "gpt", "segment", "resnet")


def table(result: BenchResult) -> str:
    """One workload's results as a Markdown table: the figures a reader compares first."""
    metric = next((r.eval_metric_name for r in result.runs if r.eval_metric_name), None)
    head = ["policy", "status", "step (median)", "p10-p90", "speed-up", "peak memory", "activations", "memory saved", "state B/param", "final loss", metric or "eval", "vs 32-true"]
    ref_params = result.runs[0].memory_breakdown.get("parameters") if result.runs else None
    n_params = ref_params / 4 if ref_params else None  # the reference holds every parameter in fp32
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.runs:
        spread = f"{fmt_seconds(r.step_time_p10_s)}-{fmt_seconds(r.step_time_p90_s)}" if r.step_time_p10_s else "—"
        saved = f"{r.memory_saved_vs_fp32:.0%}" if r.memory_saved_vs_fp32 is not None else "—"
        act = f"{fmt_bytes(r.activation_bytes)}"
        if r.activation_bytes and result.runs[0].activation_bytes:
            act += f" ({r.activation_bytes / result.runs[0].activation_bytes:.2f}x)"
        cells = [
            f"`{r.precision}`", r.status, fmt_seconds(r.step_time_median_s), spread, fmt_ratio(r.speedup_vs_fp32),
            fmt_bytes(r.peak_memory_bytes), act, saved, _bytes_per_param(r, n_params),
            f"{r.final_loss:.4f}" if r.final_loss is not None else "—",
            f"{r.eval_metric:.4f}" if r.eval_metric is not None else "—",
            # One-sided, against tolerance and the reference's eval noise (ampkit.bench._quality defines each word).
            "—" if r.precision == "32-true" or r.quality is None else (f"**{r.quality}**" if r.quality == "worse" else r.quality),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bytes_per_param(run: RunResult, n_params: float | None) -> str:
    """Weights, gradients, optimizer state and masters (as held between steps) per parameter of the model."""
    parts = ("parameters", "gradients", "optimizer_state", "master_weights")
    if not n_params or not all(k in run.memory_breakdown for k in parts):
        return "—"
    return f"{sum(run.memory_breakdown[k] for k in parts) / n_params:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="one sub-directory per workload is written here")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--size", default="auto")
    parser.add_argument("--tables-only", action="store_true", help="print tables from existing results")
    parser.add_argument("bench_args", nargs="*", help="more ampkit bench arguments, after --")
    args = parser.parse_args()
    for name in args.workloads.split(","):
        out = args.out / name
        if not args.tables_only:
            cmd = [sys.executable, "-m", "ampkit", "bench", "-w", name, "--size", args.size, "--no-progress", "--out", str(out), *args.bench_args]
            args.out.mkdir(parents=True, exist_ok=True)
            with open(args.out / f"{name}.txt", "w") as log:  # the terminal output, kept beside the results
                subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT)
        result = BenchResult.read_json(out / "results.json")
        print(f"### `{result.workload}`: {result.description}\n")
        print(f"`{result.command}` · {result.device.get('name')} ({result.device.get('type')}) · torch {result.torch} · {result.date[:10]}\n")
        print(table(result) + "\n")
        for r in result.runs:
            print(f"- {r.verdict}")
        if result.recovery:
            print(f"- {result.recovery}")
        if result.eval_noise:
            print(f"- {result.eval_noise}")
        legend = legend_lines(result)
        if legend:
            print(f"\n{legend[0]}\n")
            for line in legend[1:]:
                print(f"- {line}")
        print()


if __name__ == "__main__":
    main()
