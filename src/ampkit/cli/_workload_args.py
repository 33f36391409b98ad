"""What bench, doctor and memory read alike from their arguments: the device, the workload, the command line.

The flags themselves are declared once in :mod:`ampkit.cli._parsers` (which imports no torch, for ``--help``);
this module turns their values into a ``torch.device``, a :class:`~ampkit.workloads.Workload` (by the rules of
:mod:`ampkit.workloads._choose`) and the command line a result file records, so every subcommand accepts, defaults
and refuses them the same way.

    >>> import argparse
    >>> args = argparse.Namespace(device="cpu", size="auto", argv=["doctor", "-w", "gpt"])
    >>> device = device_arg(args.device, command="doctor")
    >>> device, workload_size(args, device), recorded_command(args)
    (device(type='cpu'), 'small', 'ampkit doctor -w gpt')
"""

from __future__ import annotations

import argparse
import shlex
import sys

import torch

from ..policy._device import as_device
from ..workloads._choose import choose_workload
from ..workloads._defaults import workload_size as size_for
from ..workloads._device import default_device
from ..workloads._workload import Workload
from ._checks import device_text

__all__ = ["compile_arg", "device_arg", "recorded_command", "typed_argv", "workload_from_args", "workload_size"]


def device_arg(text: str | None, *, command: str, predicts: bool = False) -> torch.device:
    """``--device`` of ``ampkit command`` as a device: cpu or cuda; None picks the GPU when there is one.

    ``predicts``: the command only predicts for the device (memory), so CUDA need not be here and the default
    carries no index; otherwise the command runs there and CUDA must be visible. Raises ValueError naming the fix.

    >>> device_arg("meta", command="memory", predicts=True)
    Traceback (most recent call last):
    ...
    ValueError: --device meta: ampkit memory predicts for cpu or cuda.
    """
    if text is None:
        if predicts:
            return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        return default_device()
    device_text(text, command=command, predicts=predicts)  # what main() checked before importing torch
    try:
        device = as_device(text)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device {text!r} is not a device; use {'cpu or cuda' if predicts else 'cpu, cuda or cuda:N'}.") from exc
    if not predicts and device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: CUDA is not available here (CPU-only torch or no GPU visible); use --device cpu.")
    return device


def compile_arg(compile: str | None, backend: str | None = None) -> bool | str | dict[str, object] | None:
    """``Engine(compile=...)``'s argument from ``--compile`` (``model``/``regional``) and ``--compile-backend``;
    None without ``--compile``. Raises ValueError naming the fix.

    >>> compile_arg("regional"), compile_arg(None), compile_arg("model", "eager")
    ('regional', None, {'backend': 'eager', 'regional': False})
    """
    if compile is None:
        if backend is not None:
            raise ValueError(f"--compile-backend {backend} without --compile: add --compile (or --compile regional).")
        return None
    if backend is None:
        return True if compile == "model" else "regional"
    known = torch.compiler.list_backends(exclude_tags=())  # aot_eager and eager are tagged debug: listed too
    if backend not in known:
        raise ValueError(f"--compile-backend {backend} is not a torch.compile backend; pick one of {', '.join(known)}.")
    return {"backend": backend, "regional": compile == "regional"}


def workload_size(args: argparse.Namespace, device: torch.device) -> str:
    """``--size``, with ``auto`` resolved for ``device`` (small on a CPU, large on a GPU)."""
    return size_for(args.size, device)


def workload_from_args(
    args: argparse.Namespace, device: torch.device, size: str, *, steps: int | None = None, warmup: int | None = None,
    data_use: str = "run it on", batch_size: int | None = None, accumulate: int = 1,
) -> Workload:
    """The workload ``-w``/``--model``/``--data``/``--seed`` describe, at ``size``, with ``steps``/``warmup`` set,
    by the rules of :func:`ampkit.workloads.choose_workload` (``data_use``: what the command does with the data,
    for the message refusing ``--model`` alone)."""
    return choose_workload(
        args.workload, args.model, args.data, device=device, size=size, seed=args.seed, steps=steps, warmup=warmup,
        batch_size=batch_size, accumulate=accumulate, data_use=data_use,
    )


def typed_argv(args: argparse.Namespace) -> list[str]:
    """The arguments as typed: those :func:`ampkit.cli.main` recorded, else this process's own."""
    argv = getattr(args, "argv", None)
    return list(argv if argv is not None else sys.argv[1:])


def recorded_command(args: argparse.Namespace, *, world: int = 1) -> str:
    """The command line a result file records, so that it reproduces the run.

    A run of ``world`` > 1 ranks gets ``--nproc`` put back after the subcommand when it was not typed: a torchrun
    worker's own arguments lack it (:func:`ampkit.distributed._launch.strip_option` took it out).

    >>> recorded_command(argparse.Namespace(argv=["bench", "-w", "gpt"], nproc=None), world=2)
    'ampkit bench --nproc 2 -w gpt'
    """
    argv = typed_argv(args)
    if world > 1 and args.nproc is None:
        at = argv.index("bench") + 1 if "bench" in argv else 0
        argv[at:at] = ["--nproc", str(world)]
    return shlex.join(["ampkit", *argv])
