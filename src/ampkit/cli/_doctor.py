"""``ampkit doctor``: which layers of a model break in fp16 or bf16, why, and the settings that fix it.

    ampkit doctor                                        # the default built-in workload on this device
    ampkit doctor -w gpt --precision 16-mixed --out doctor/gpt
    ampkit doctor --model mypkg.nets:build --data mypkg.data:batches --out doctor/
    ampkit doctor -w gpt --compile regional              # also: the compiled step against the eager one
    ampkit doctor -w gpt --fp8-recipe rowwise            # fp8 headroom per Linear under torchao's rowwise recipe

Trains a few fp32 steps with every module recorded, then tries the policy one step at a time (see
:mod:`ampkit.numerics`). Prints the worst modules and the recommendation (stdout): the Engine line, after the
lines of a Lightning or Hugging Face Trainer script for a model from that framework; ``--out DIR`` writes
doctor.json, report.md and PNG exponent histograms. Progress goes to stderr as the bench's does (a bar on a
terminal, a line per phase in a log; ``--no-progress``: none). Exit code 0 when a 16-bit policy was recommended, 1
when none trains this model (stay in 32-true; the last line says why), 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

import torch

from .._report.dialect import check_framework
from .._report.out_dir import write_out
from ._checks import writable_dir
from ._console import stdout_console
from ._parsers import add_doctor as register  # declared apart: `ampkit --help` imports none of this module
from ._workload_args import compile_arg, device_arg, recorded_command, workload_from_args, workload_size

if TYPE_CHECKING:
    from ..numerics._doctor import Progress

__all__ = ["PhaseLines", "exit_line", "register", "run"]

log = logging.getLogger("ampkit")


def run(args: argparse.Namespace) -> int:
    """Diagnose the model the arguments describe; print the table; write the files asked for."""
    from .._util.model_io import to_device
    from ..numerics import diagnose
    from ..policy import get_policy

    writable_dir(args.out, "--out")
    compile = compile_arg(args.compile, args.compile_backend)  # bad flags are refused before the workload is built
    device = device_arg(args.device, command="doctor")
    target = get_policy(args.precision) if args.precision is not None else None  # made a Policy here, once
    if target is not None:
        target.check_device(device)
    size = workload_size(args, device)
    steps_needed = args.steps + 1  # the reference steps, then the batch the policy step is compared on
    workload = workload_from_args(args, device, size, steps=max(steps_needed, 2), warmup=1)
    framework = check_framework(workload.extra.get("framework"))  # the prescription is printed in its terms too
    console = stdout_console()
    console.print(f"[dim]ampkit doctor: {args.steps} fp32 reference steps of {workload.name}, then one step per policy tried...[/dim]")
    batches = [to_device(b, device, workload.channels_last) for b in workload.train_batches[:steps_needed]]
    model = workload.model.to(device)
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
    command = recorded_command(args)
    diagnosis = diagnose(
        model, batches, workload.loss_fn, steps=args.steps, target=target, optimizer=workload.optimizer, seed=args.seed, progress=_progress(args),
        compile=compile, update_steps=args.update_steps, fp8_recipe=None if args.fp8_recipe == "none" else args.fp8_recipe,
        context={"command": command, "workload": {"name": workload.name, "description": workload.description, "size": size if args.data is None else None}},
    )
    diagnosis.framework = framework
    data = diagnosis.to_dict()
    from ..numerics._table import render

    render(data, console, top=args.top)
    if args.out is not None:
        from ..numerics._plots import write_plots
        from ..numerics._report import write_report

        results, report = write_out(args.out, "doctor.json", data, write_json=diagnosis.write_json, write_plots=write_plots, write_report=write_report)
        console.print(f"doctor.json: {results}, report: {report}")
    if diagnosis.recommended_precision != "32-true":
        return 0
    console.print(exit_line(diagnosis.precision_reasons))
    return 1


def exit_line(reasons: list[str]) -> str:
    """The last line when the doctor exits 1: what the exit code means, and the reason the recommendation gives.

    >>> exit_line(["no 16-bit policy trained a finite step even with modules kept in fp32: stay in 32-true"])
    'exit 1: no 16-bit policy was shown to train this model here (no 16-bit policy trained a finite step even with modules kept in fp32: stay in 32-true); train in 32-true, the Paste line above'
    """
    why = next((r for r in reversed(reasons) if "32-true" in r), reasons[-1] if reasons else "")
    return f"exit 1: no 16-bit policy was shown to train this model here{f' ({why})' if why else ''}; train in 32-true, the Paste line above"


def _progress(args: argparse.Namespace) -> Progress | None:
    """The doctor's progress on stderr, as the bench shows it: a bar on a terminal, a line per phase in a log."""
    if getattr(args, "no_progress", False):
        return None
    if sys.stderr.isatty():
        from ..bench._progress import RichReporter

        return RichReporter()
    return PhaseLines(sys.stderr)


class PhaseLines:
    """Progress as plain lines for a log (CI, ``nohup``, a pipe): one per phase of the doctor, with the time since the
    start and the phase's place among them; flushed, so ``tail -f`` shows each as it starts.

    >>> import io
    >>> out, times = io.StringIO(), iter([0.0, 0.0, 4.0, 65.0, 70.0])
    >>> lines = PhaseLines(out, clock=lambda: next(times))
    >>> lines.start(5); lines.update("fp32 reference: 3 steps"); lines.update("bf16-mixed: tailoring", advance=3)
    >>> lines.update("done", advance=2); lines.finish()
    >>> print(out.getvalue(), end="")
    [0:00] 0/5: fp32 reference: 3 steps
    [0:04] 3/5: bf16-mixed: tailoring
    [1:05] 5/5: done
    """

    def __init__(self, stream: TextIO, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._clock = stream, clock
        self._total = self._done = 0
        self._start = 0.0

    def start(self, total: int) -> None:
        self._total, self._done, self._start = total, 0, self._clock()

    def update(self, description: str, advance: int = 0) -> None:
        self._done += advance
        minutes, seconds = divmod(int(self._clock() - self._start), 60)
        print(f"[{minutes}:{seconds:02d}] {self._done}/{self._total}: {description}", file=self._stream, flush=True)

    def finish(self) -> None:
        pass
