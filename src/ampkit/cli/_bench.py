"""``ampkit bench``: one training run under several precision policies, side by side, with a verdict.

    ampkit bench                                   # the default workload, every policy this device runs fast
    ampkit bench -w digits --precision 32-true,bf16-mixed,16-mixed --out runs/digits
    ampkit bench --model mypkg.nets:build --data mypkg.data:batches --steps 200 --tensorboard tb/

Prints its progress while running on stderr (a bar on a terminal, plain lines in a log) and a table with one verdict
per policy at the end (stdout), then, where some policy pays, the change to paste for the fastest that does, in the
terms of the framework the model came from (:mod:`ampkit.bench._advice`).
``--out DIR`` writes results.json, report.md and plots. Exit code 0 when every run produced figures, 1 when a
run failed (its row says why), 2 for bad input.

``--nproc N`` (N > 1) checks the arguments here, then runs the same command in N processes through torchrun
(:mod:`ampkit.distributed._launch`); each process, a torchrun worker, joins the process group and trains every
policy under DDP on its slice of each batch. Rank 0 alone prints and writes files.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

import torch
import torch.distributed as dist
from rich.console import Console
from rich.text import Text

from .._errors import AmpkitError, one_line
from .._report.dialect import check_framework
from .._report.out_dir import write_out
from .._util.values import clip_from
from ..bench._advice import closing_lines
from ..bench._defaults import default_precisions, resolve_precisions
from ..bench._progress import NullReporter, PlainReporter, Reporter, RichReporter
from ..bench._results import BenchResult
from ..bench._runner import check_shardable, run_bench
from ..distributed._agreement import agree_max
from ..distributed._environment import init_distributed, launched_by_torchrun, shutdown
from ..distributed._launch import relaunch, report_exit_code, strip_option
from ..distributed._rank_logging import rank
from ..policy import Policy
from ..workloads import Workload
from ._checks import writable_dir
from ._console import stdout_console
from ._parsers import add_bench as register
from ._workload_args import (
    device_arg,
    recorded_command,
    typed_argv,
    workload_from_args,
    workload_size,
)

__all__ = ["register", "run"]  # register: declared apart (parsers), so `ampkit --help` imports none of this module

log = logging.getLogger("ampkit")


_COMPILE = {"model": True, "regional": "regional"}
"""``--compile MODE`` -> what ``Engine(compile=...)`` gets."""


def _precisions(args: argparse.Namespace, device: torch.device) -> tuple[list[Policy], dict[str, str]]:
    """The policies to run, reference first, and {policy left out by default: why}: ``--precision`` made into
    Policy objects here, once (the names were checked before torch's import; the device is checked here)."""
    if args.precision is None:
        return default_precisions(device)
    return resolve_precisions(args.precision, device), {}


def _workload(args: argparse.Namespace, device: torch.device, size: str) -> Workload:
    """The workload the arguments describe, checked against ``--steps``/``--warmup`` and ``--tolerance``; its recipe
    set from ``--batch-size``, ``--accumulate``, ``--clip`` and ``--lr`` (each value checked before torch's import)."""
    workload = workload_from_args(
        args, device, size, steps=args.steps, warmup=args.warmup, data_use="train it on", batch_size=args.batch_size, accumulate=args.accumulate,
    )
    if args.clip is not None:
        workload.clip_grad_norm = clip_from(args.clip)
    workload.lr = args.lr
    if workload.steps <= workload.warmup:
        raise ValueError(f"--steps {workload.steps} must exceed --warmup {workload.warmup} so some steps are timed.")
    check_framework(workload.extra.get("framework"))  # the closing advice is printed in its terms: refused now, not after the runs
    if args.tolerance is not None and (workload.metric is None or not workload.eval_batches):
        raise ValueError(
            f"--tolerance {args.tolerance}: workload {workload.name} has no eval metric to hold to it; drop --tolerance "
            "(or, for your own model, return a BenchData with eval batches from --data)."
        )
    return workload


def _check_dirs(args: argparse.Namespace) -> None:
    """Refuse an unwritable ``--out`` or ``--tensorboard`` before anything runs."""
    writable_dir(args.out, "--out")
    writable_dir(args.tensorboard, "--tensorboard")


def _names_a_gpu(args: argparse.Namespace) -> bool:
    """``--device cuda:N``: one GPU for every process, where each of several must take its own (cuda:LOCAL_RANK)."""
    return args.device is not None and torch.device(args.device).index is not None


def run(args: argparse.Namespace) -> int:
    """Run the bench the arguments describe; print the table; write the files asked for.

    Three ways in: a torchrun worker (every rank runs the bench under DDP), ``--nproc N`` with N > 1 (check the
    arguments, then start N workers through torchrun), or a single process.
    """
    if launched_by_torchrun():
        return _run_worker(args)
    if (args.nproc or 1) > 1:
        return _launch(args, args.nproc)
    return _bench(args, device_arg(args.device, command="bench"))


def _launch(args: argparse.Namespace, nproc: int) -> int:
    """Refuse what the workers would refuse (once, here, with exit code 2), then run the command under torchrun."""
    _check_dirs(args)
    device = device_arg(args.device, command="bench")
    if device.type == "cuda":
        if _names_a_gpu(args):
            raise ValueError(f"--nproc {nproc} --device {args.device}: each process takes its own GPU (cuda:LOCAL_RANK); pass --device cuda.")
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise ValueError(
                f"--nproc {nproc} on cuda needs {nproc} GPUs but {gpus} {'is' if gpus == 1 else 'are'} visible: "
                f"use --nproc {gpus} or fewer, or --device cpu to run {nproc} processes on the CPU."
            )
    size = workload_size(args, device)
    _precisions(args, device)  # refused here, once for all the workers, with exit code 2
    workload = _workload(args, device, size)
    try:
        check_shardable(workload.train_batches, nproc, workload.steps)
    except ValueError as exc:
        raise ValueError(f"--nproc {nproc}: {exc}") from None
    del workload  # the workers build their own
    module_args = strip_option(typed_argv(args), "--nproc")
    log.info("starting %d processes: torchrun --standalone --nproc-per-node %d -m ampkit %s", nproc, nproc, shlex.join(module_args))
    return relaunch(nproc, module_args)


def _run_worker(args: argparse.Namespace) -> int:
    """One torchrun worker: join the process group, run the bench under DDP, agree on the exit code.

    An input error is the same on every rank: rank 0 prints it, every rank exits 2. Any other exception leaves
    without the closing barrier, so the process exits at once and torchrun stops the other workers.
    """
    world = int(os.environ["WORLD_SIZE"])
    try:
        if args.nproc is not None and args.nproc != world:
            raise ValueError(f"--nproc {args.nproc}, but torchrun started {world} processes: drop --nproc when you launch with torchrun yourself.")
        device = device_arg(args.device, command="bench")
        if device.type == "cuda" and world > 1 and _names_a_gpu(args):
            raise ValueError(f"--device {args.device} under torchrun: each process takes its own GPU (cuda:LOCAL_RANK); pass --device cuda.")
        env = init_distributed(device=device.type)  # cuda -> cuda:LOCAL_RANK
    except (AmpkitError, ValueError) as exc:
        return _worker_input_error(exc, rank())
    try:
        code = _bench(args, env.device, main=env.is_main, world=env.world_size)
    except (AmpkitError, ValueError) as exc:
        dist.destroy_process_group()
        return _worker_input_error(exc, env.rank)
    code = agree_max(code)  # rank 0 decides the files; every rank exits alike so torchrun sees one outcome
    shutdown()
    return report_exit_code(code, env.rank)


def _worker_input_error(exc: BaseException, this_rank: int) -> int:
    """Rank 0 prints the one-line error; every rank exits 2 (main's convention for bad input)."""
    if this_rank == 0:
        print(f"ampkit: error: {one_line(exc)}", file=sys.stderr)
    report_exit_code(2, this_rank)
    return 2  # non-zero even when relaunched: torchrun then stops ranks that did not fail


def _bench(args: argparse.Namespace, device: torch.device, *, main: bool = True, world: int = 1) -> int:
    """The bench itself, in one process or on one rank (``main``: rank 0, the one that prints and writes)."""
    console = stdout_console(quiet=not main)
    _check_dirs(args)
    size = workload_size(args, device)
    policies, left_out = _precisions(args, device)
    workload = _workload(args, device, size)
    if args.fp8 is not None and main:  # the plan on its own; an fp8 policy's run prints its own after the results
        from ..bench._fp8_table import print_fp8_table
        from ..memory._fp8_layers import fp8_layer_plan

        print_fp8_table(fp8_layer_plan(workload.model, workload.train_batches[0], gpu=None if args.fp8 == "auto" else args.fp8), console)

    sized = f" ({size})" if args.data is None else ""  # user data has no size; --size scales built-in workloads
    where = f"{device.type} x {world} processes (DDP)" if world > 1 else str(device)
    console.print(f"[bold]ampkit bench[/bold]: {workload.name}{sized} on {where}: {workload.description}")
    compiled = f", each also compiled ({args.compile})" if args.compile else ""
    console.print(f"policies: {', '.join(p.name for p in policies)}{compiled}; {workload.steps} steps each, {workload.warmup} of them warm-up")
    if workload.accumulate > 1:
        items = f"{workload.items_per_batch * workload.accumulate:,} {workload.unit}"
        console.print(f"a step: one optimizer update over {workload.accumulate} batches ({items}); step time and throughput count all of them")
    for name, why in left_out.items():
        log.info("not run by default: %s (%s)", name, why)
    if left_out:
        console.print(f"[dim]not run by default here: {', '.join(left_out)} (slow or unsupported on {device.type}; name them in --precision to run them)[/dim]")

    command = recorded_command(args, world=world)
    # A bar on a terminal; plain lines in a log (CI, a pipe), where a bar shows nothing for the whole run.
    reporter: Reporter = NullReporter() if not main or args.no_progress else RichReporter() if sys.stderr.isatty() else PlainReporter(sys.stderr)
    result = run_bench(
        workload, policies, device, seed=args.seed, rounds=args.rounds, reporter=reporter, command=command,
        settings={"size": size, "batch_items": workload.items_per_batch, "unit": workload.unit},
        tolerance=None if args.tolerance is None else float(args.tolerance), compile=_COMPILE.get(args.compile),
    )
    if main:
        _present(result, args, console)
    return 1 if any(r.status == "failed" for r in result.runs) else 0


def _present(result: BenchResult, args: argparse.Namespace, console: Console) -> None:
    from ..bench import _table as table

    table.render(result, console)
    closing = closing_lines(result)  # the change to paste, in the model's framework, where some policy pays
    if closing:
        console.print()
        code = set(closing[1:])
        for line in closing:
            console.print(Text(line, style="" if line in code else "bold"), soft_wrap=True)  # pasted: never broken
    if args.out is not None:
        from ..bench._plots import write_plots
        from ..bench._report import write_report

        results, report = write_out(args.out, "results.json", result, write_json=result.write_json, write_plots=write_plots, write_report=write_report)
        console.print(f"results: {results}, report: {report}")
    if args.tensorboard is not None:
        from ..bench._tensorboard import log_tensorboard

        log_dir = log_tensorboard(result, args.tensorboard)
        console.print(f"tensorboard: tensorboard --logdir {log_dir}")
