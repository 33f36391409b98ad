"""What bench, doctor and memory read alike from their arguments: the device, the workload, the command line.

The flags themselves are declared once in :mod:`ampkit.cli.parsers` (which imports no torch, for ``--help``);
this module turns their values into a ``torch.device``, a :class:`~ampkit.bench.workload.Workload` and the
command line a result file records, so every subcommand accepts, defaults and refuses them the same way.

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

from ..bench.defaults import default_device, default_size, default_workload
from ..bench.workload import Workload
from ..policy.device import as_device
from .checks import device_text

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
    return default_size(device) if args.size == "auto" else args.size


def workload_from_args(
    args: argparse.Namespace, device: torch.device, size: str, *, steps: int | None = None, warmup: int | None = None,
    data_use: str = "run it on", batch_size: int | None = None, accumulate: int = 1,
) -> Workload:
    """The workload ``-w``/``--model``/``--data``/``--seed`` describe, at ``size``, with ``steps``/``warmup`` set.

    A built-in workload keeps its own steps and warm-up where ``steps``/``warmup`` are None; the user's data has
    none of its own, so there they default to ``-w``'s (when ``--model`` trains on a built-in's data) or to 100
    steps and a tenth of them (at most 5) as warm-up. ``--model`` alone is refused before anything of the user's
    is imported; ``data_use`` says what the command does with the data, for that message. ``batch_size``
    rebuilds a built-in workload's batches (the user's ``--data`` makes its own: refused there); ``accumulate``
    micro-batches make each step, so the user's data is read for ``steps * accumulate`` batches.
    """
    # Here: the workloads import scikit-learn and friends, only when a command runs.
    from ..bench.user import user_workload
    from ..bench.workloads import get_workload

    if args.model is None and args.data is None:
        name = default_workload(device) if args.workload is None else args.workload
        workload = get_workload(name, size=size, seed=args.seed, batch_size=batch_size)
    else:
        if args.data is None and args.workload is None:
            raise ValueError(f"--model without --data needs --workload NAME (the data to {data_use}), or --data pkg.module:factory.")
        if args.data is not None and batch_size is not None:
            raise ValueError(
                f"--batch-size {batch_size} applies to a built-in workload's data; your --data {args.data} makes its own "
                "batches: return batches of that many rows from it (or drop --batch-size)."
            )
        base = get_workload(args.workload, size=size, seed=args.seed, batch_size=batch_size) if args.workload is not None else None
        steps = steps or (base.steps if base else 100)
        warmup = warmup if warmup is not None else (base.warmup if base else min(5, steps // 10))
        workload = user_workload(args.model, args.data, steps=steps, warmup=warmup, base=base, accumulate=accumulate)
    # --model on a built-in workload's data copies that workload, its steps included: the run's settings win.
    if steps is not None:
        workload.steps = steps
    if warmup is not None:
        workload.warmup = warmup
    workload.accumulate = accumulate
    return workload


def typed_argv(args: argparse.Namespace) -> list[str]:
    """The arguments as typed: those :func:`ampkit.cli.main.main` recorded, else this process's own."""
    argv = getattr(args, "argv", None)
    return list(argv if argv is not None else sys.argv[1:])


def recorded_command(args: argparse.Namespace, *, world: int = 1) -> str:
    """The command line a result file records, so that it reproduces the run.

    A run of ``world`` > 1 ranks gets ``--nproc`` put back after the subcommand when it was not typed: a torchrun
    worker's own arguments lack it (:func:`ampkit.distributed.launch.strip_option` took it out).

    >>> recorded_command(argparse.Namespace(argv=["bench", "-w", "gpt"], nproc=None), world=2)
    'ampkit bench --nproc 2 -w gpt'
    """
    argv = typed_argv(args)
    if world > 1 and args.nproc is None:
        at = argv.index("bench") + 1 if "bench" in argv else 0
        argv[at:at] = ["--nproc", str(world)]
    return shlex.join(["ampkit", *argv])
