"""``ampkit profile``: where a training step's time goes, why the device waits, and which change gives it back.

    ampkit profile                                       # digits through a slow per-sample augmentation
    ampkit profile -w gpt --precision bf16-mixed --out prof/gpt --trace
    ampkit profile --model mypkg.nets:build --data mypkg.data:loader --out prof/

Trains the workload through a DataLoader under :class:`ampkit.profile.Profiler` (phases, host syncs, a short
torch.profiler trace), then times the DataLoader's variants on the same step (see :mod:`ampkit.profile._trials`).
A ``--data`` factory returning a DataLoader is profiled and varied as it is; one returning batches is read from
memory. Prints the table and the advice (stdout); ``--out DIR`` writes profile.json, report.md, phases.png,
trials.png and, with ``--trace``, trace.json. Exit code 0, 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch

from ..policy import Policy, get_policy
from ..workloads import BenchData, Workload, load_factory
from ._checks import writable_dir
from ._console import stdout_console
from ._parsers import (
    add_profile as register,  # declared apart: `ampkit --help` imports none of this module
)
from ._workload_args import (
    compile_arg,
    device_arg,
    recorded_command,
    workload_from_args,
    workload_size,
)

if TYPE_CHECKING:
    from ..profile._progress import Progress

__all__ = ["DEFAULT_WORKLOAD", "register", "run"]

log = logging.getLogger("ampkit")

DEFAULT_WORKLOAD = "digits-aug"
"""The workload profiled without ``-w``/``--model``: digits through a deliberately slow per-sample augmentation,
an input-bound loop with something for the advice to fix."""


def _policy(args: argparse.Namespace, device: torch.device) -> Policy:
    """``--precision`` made a Policy here, once, and checked on ``device``; by default bf16-mixed where it is fast."""
    if args.precision is not None:
        policy = get_policy(args.precision)
        policy.check_device(device)
        return policy
    mixed = get_policy("bf16-mixed")
    support = mixed.support(device)
    return mixed if support.supported and support.fast else get_policy("32-true")


def _user_loader(args: argparse.Namespace) -> Iterable[Any] | None:
    """The training data a ``--data`` factory returns, profiled as the loop reads it: a DataLoader, the ``train``
    of a BenchData, or any iterable not already in memory (a generator, an iterable without a length); None for
    the rest (a list of batches, a ``datasets.Dataset``, a built-in workload's data), read through the workload."""
    if args.data is None:
        return None
    data = load_factory(args.data, "--data")()
    train = data.train if isinstance(data, BenchData) else data
    if isinstance(train, (torch.utils.data.DataLoader, Iterator)):
        return train
    if isinstance(train, Iterable) and not isinstance(train, (Sized, Mapping, torch.Tensor, str, bytes)):
        return train  # a stream without a length (an IterableDataset, a reader of files): its reads are the data phase
    return None


def _workload(args: argparse.Namespace, device: torch.device, size: str, loader: Any) -> Workload:
    if args.model is None and args.data is None and args.workload is None:
        args.workload = DEFAULT_WORKLOAD
    # The user's loader is read for two batches only, to check the model runs on them; the profile then reads it itself.
    steps = 2 if loader is not None else args.warmup + args.plain_steps + args.steps + args.sync_steps + args.trace_steps
    return workload_from_args(args, device, size, steps=steps, warmup=1, data_use="profile it on")


def _varied(args: argparse.Namespace, loader: Any, workload: Workload) -> bool:
    """Whether the profile times the DataLoader's variants: asked, and a DataLoader to vary (the user's, or the one a
    built-in workload's per-sample dataset is read through)."""
    given = isinstance(loader, torch.utils.data.DataLoader) or (loader is None and workload.samples is not None)
    return not args.no_trials and given


def _progress(args: argparse.Namespace) -> Progress | None:
    """As bench shows it, on stderr: a bar on a terminal, a line per phase in a log; none with --no-progress."""
    if args.no_progress:
        return None
    from ..bench._progress import RichReporter
    from ..profile._progress import PhaseLines

    return RichReporter() if sys.stderr.isatty() else PhaseLines(sys.stderr)


def _workload_flags(args: argparse.Namespace, size: str) -> str:
    """The flags that give ``ampkit bench`` the workload profiled, for the bench commands the advice gives: every
    workload option as given (a built-in's size resolved), the device if named, and the compile mode, so that the
    bench runs what was profiled. Ends with a space (the advice appends its own flags)."""
    flags = [f"--model {args.model}"] if args.model is not None else []
    flags += [f"--data {args.data}"] if args.data is not None else []
    if args.workload is not None:  # the model or the data of a built-in workload, at this size
        flags.append(f"-w {args.workload} --size {size}")
    flags += [f"--seed {args.seed}"] if args.seed != 0 else []
    flags += [f"--device {args.device}"] if args.device is not None else []
    if args.compile is not None:
        flags.append("--compile" + (" regional" if args.compile == "regional" else ""))
    return " ".join(flags) + " "


def run(args: argparse.Namespace) -> int:
    """Profile the workload the arguments describe; print the table; write the files asked for."""
    from ..profile._run import profile_workload
    from ..profile._table import render

    writable_dir(args.out, "--out")
    if args.trace and args.out is None:
        raise ValueError("--trace writes trace.json into --out DIR: add --out DIR.")
    compile = compile_arg(args.compile)
    device = device_arg(args.device, command="profile")
    policy = _policy(args, device)
    size = workload_size(args, device)
    loader = _user_loader(args)
    workload = _workload(args, device, size, loader)
    console = stdout_console()
    console.print(
        f"[dim]ampkit profile: {workload.name} under {policy.name} on {device}: {args.warmup} warm-up steps, "
        f"{args.plain_steps} plain, {args.steps} timed, {args.sync_steps} with syncs counted, {args.trace_steps} traced"
        f"{', then the DataLoader variants' if _varied(args, loader, workload) else ''}...[/dim]"
    )
    context = {
        "command": recorded_command(args),
        "workload": {"name": workload.name, "description": workload.description, "size": size if args.data is None else None},
        "workload_flags": _workload_flags(args, size),
    }
    data = profile_workload(
        workload, policy, device, compile=compile, loader=loader, warmup=args.warmup, plain_steps=args.plain_steps, timed=args.steps,
        sync_steps=args.sync_steps, trace_steps=args.trace_steps, trials=not args.no_trials,
        trace_dir=args.out if args.trace else None, seed=args.seed, context=context, progress=_progress(args),
    )
    render(data, console)
    if args.out is not None:
        from ..profile._files import save_profile

        results, report = save_profile(data, args.out)
        console.print(f"profile.json: {results}, report: {report}")
    return 0
