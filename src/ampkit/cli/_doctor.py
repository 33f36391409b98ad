"""``ampkit doctor``: which layers of a model break in fp16 or bf16, why, and the settings that fix it.

    ampkit doctor                                        # the default built-in workload on this device
    ampkit doctor -w gpt --precision 16-mixed --out doctor/gpt
    ampkit doctor --model mypkg.nets:build --data mypkg.data:batches --out doctor/
    ampkit doctor -w gpt --compile regional              # also: the compiled step against the eager one
    ampkit doctor -w gpt --fp8-recipe rowwise            # fp8 headroom per Linear under torchao's rowwise recipe

Trains a few fp32 steps with every module recorded, then tries the policy one step at a time (see
:mod:`ampkit.numerics`). Prints the worst modules and the recommendation (stdout): the Engine line, after the
lines of a Lightning or Hugging Face Trainer script for a model from that framework; ``--out DIR`` writes
doctor.json, report.md and PNG exponent histograms. Exit code 0 when a 16-bit policy was recommended, 1 when
none trains this model (stay in 32-true), 2 for bad input.
"""

from __future__ import annotations

import argparse
import logging

import torch

from .._report.dialect import check_framework
from .._report.out_dir import write_out
from ._checks import writable_dir
from ._console import stdout_console
from ._parsers import add_doctor as register  # declared apart: `ampkit --help` imports none of this module
from ._workload_args import compile_arg, device_arg, recorded_command, workload_from_args, workload_size

__all__ = ["register", "run"]

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
        model, batches, workload.loss_fn, steps=args.steps, target=target, optimizer=workload.optimizer, seed=args.seed,
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
    return 0 if diagnosis.recommended_precision != "32-true" else 1
