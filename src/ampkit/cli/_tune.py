"""``ampkit tune``: the fastest training configuration that keeps fp32's accuracy, found and proven here.

    ampkit tune -w digits --size tiny --budget 120 --out tune/digits
    ampkit tune --model mypkg.nets:build --data mypkg.data:loader --run-steps 20000 --out tune/mine

Prints its progress on stderr (a bar with the time left on a terminal, a line per phase in a log), then the ranked
table, what was pruned or not tried and why, and the winner as code (stdout). ``--out DIR`` writes tune.json and
report.md, and keeps trials.json as trials complete: the same command with the same ``--out`` resumes a tune that
was killed. Ctrl-C ends the tune with what was measured (exit code 130). Exit code 0, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from ..policy import get_policy
from ..profile import workload_loader
from ..tuning import STAGES, TuneResult, WaveSettings, tune_workload, write_files
from ..tuning._report import render
from ..workloads import Workload, load_factory
from ..workloads._lightning_step import StepCall, step_loader
from ._checks import writable_dir
from ._console import stdout_console
from ._parsers import add_tune as register  # declared apart: `ampkit --help` imports none of this module
from ._workload_args import device_arg, recorded_command, workload_from_args, workload_size

__all__ = ["register", "run"]


def _stages(text: str | None) -> list[str] | None:
    if text is None:
        return None
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ValueError(f"--stages {text}: the stages are {', '.join(STAGES)}.")
    return stages


def _precisions(text: str | None, device: torch.device) -> list[str] | None:
    """``--precision`` as policy names, each checked on ``device`` (names were checked before torch's import)."""
    if text is None:
        return None
    names = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        policy = get_policy(part)
        policy.check_device(device)
        names.append(policy.name)
    return names


def _loader(args: argparse.Namespace, workload: Workload) -> torch.utils.data.DataLoader[Any] | None:
    """The DataLoader the workload is read through, whose settings are then tuned: a ``--data`` factory's own
    DataLoader, or a built-in workload's per-sample dataset (``digits-aug``); None for data already in memory."""
    if args.data is not None:
        data = load_factory(args.data, "--data")()
        if not isinstance(data, torch.utils.data.DataLoader):
            return None
        # A LightningModule's training_step takes the loader's batches whole (the tune's trials call it through StepCall).
        return step_loader(data) if isinstance(workload.model, StepCall) else data
    return workload_loader(workload) if workload.samples is not None else None


class _Progress:
    """The tune's progress on stderr: a rich bar over the budget with the time left on a terminal; in a log, a line
    each time the phase changes (a candidate's memory, warm-up or compile, each round of timing, a guard run), with
    the time spent and the most left, so a person reading the log sees what runs and whether it is a compile."""

    def __init__(self, budget: float, enabled: bool) -> None:
        self.enabled, self.budget = enabled, budget
        self.bar: Any = None
        self.task: Any = None
        self.last = ""
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]{task.description:<64}"), BarColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[left]}"), console=Console(stderr=True), transient=True)

    def start(self) -> None:
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("starting", total=self.budget, left="")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, what: str, elapsed: float, left: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            from rich.markup import escape

            self.bar.update(self.task, description=escape(what[:64]), completed=min(elapsed, self.budget), left=f"at most {left:.0f} s left")
            return
        if what != self.last:
            self.last = what
            print(f"[{elapsed:5.0f} s, at most {left:.0f} s left] {what}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Tune the workload the arguments describe; print the table and the winner; write the files asked for."""
    writable_dir(args.out, "--out")
    stages = _stages(args.stages)
    device = device_arg(args.device, command="tune")
    precisions = _precisions(args.precision, device)
    size = workload_size(args, device)
    waves = WaveSettings(rounds=args.rounds, chunk=args.chunk)
    guard_steps = args.guard_steps
    # Your own data is read for as many steps as the longest run needs (a guard run, or a trial).
    steps = max(guard_steps or 30, waves.steps) if args.data is not None else None
    workload = workload_from_args(args, device, size, steps=steps, data_use="tune it on", batch_size=args.batch_size, accumulate=args.accumulate)
    console = stdout_console()
    sized = f" ({size})" if args.data is None else ""
    console.print(f"[bold]ampkit tune[/bold]: {workload.name}{sized} on {device}, within {args.budget} s: {workload.description}")
    started = time.monotonic()
    progress = _Progress(args.budget, not args.no_progress)
    progress.start()
    try:
        result: TuneResult = tune_workload(
            workload, device, budget=args.budget, run_steps=args.run_steps, out=args.out, seed=args.seed, waves=waves,
            guard_steps=guard_steps, memory_budget=args.device_memory, loader=_loader(args, workload), stages=stages,
            precisions=precisions, command=recorded_command(args), progress=progress,
        )
    finally:
        progress.stop()
    render(result, console)
    if args.out is not None:
        data, report = write_files(result, args.out)
        console.print(f"tune.json: {data}, report: {report} ({time.monotonic() - started:.0f} s)")
    return 130 if result.interrupted else 0
