"""The bench runner: one workload trained under several policies, side by side, measured fairly.

Fairness, step by step:

1. **Same start.** Every run trains a deep copy of the workload's model (same weights), on the same batches in
   the same order, with its own RNG seeded identically (same dropout masks).
2. **Memory alone.** Each policy first runs a few steps on a throwaway copy while no other run is alive, so its
   memory figures are its own: the CUDA allocator's peak, or on CPU the exact bytes of parameters, gradients,
   optimizer state, masters and saved activations (plus the process peak RSS). FLOPs are counted there too.
3. **Time interleaved.** Then all runs are built, warmed up (untimed), and trained in rounds of equal chunks,
   the order rotating each round, so a machine that speeds up or slows down (turbo, a neighbour's job,
   thermal throttling) spreads over every policy instead of biasing the one that ran at that moment.
4. **Failures stay in their row.** An exception inside one policy's run marks that run failed; the rest go on.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.bench.workload import Accuracy, Workload
    >>> g = torch.Generator().manual_seed(0)
    >>> data = [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(4)]
    >>> w = Workload(name="toy", model=nn.Linear(8, 4), train_batches=data, eval_batches=data[:1],
    ...              metric=Accuracy, items_per_batch=16, steps=6, warmup=2)
    >>> result = run_bench(w, ["32-true", "bf16-mixed"], "cpu", rounds=2)
    >>> [(r.precision, r.status, r.timed_steps, len(r.losses)) for r in result.runs]
    [('32-true', 'ok', 4, 6), ('bf16-mixed', 'ok', 4, 6)]
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from typing import Any

import torch

from .. import __version__
from ..policy import get_policy
from ..policy.device import as_device, cpu_bf16_native, cpu_fp16_native, cpu_name
from .flops import peak_flops
from .policy_run import PolicyRun
from .progress import NullReporter, Reporter
from .results import BenchResult
from .verdict import Tolerance, apply_verdicts
from .workload import Batch, Workload

__all__ = ["run_bench", "device_info", "REFERENCE"]

log = logging.getLogger("ampkit")

REFERENCE = "32-true"
"""The control every policy is compared with."""


def device_info(device: torch.device) -> dict[str, Any]:
    """What results.json records about the device the bench ran on.

    >>> device_info(torch.device("cpu"))["type"]
    'cpu'
    """
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
        }
    if device.type == "cpu":
        return {
            "type": "cpu",
            "name": cpu_name(),
            "threads": torch.get_num_threads(),
            "bf16_native": cpu_bf16_native(),
            "fp16_native": cpu_fp16_native(),
        }
    return {"type": device.type, "name": str(device)}


def to_device(value: Any, device: torch.device, channels_last: bool) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.to(device, non_blocking=True)
        if channels_last and value.dim() == 4 and value.is_floating_point():
            value = value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device, channels_last) for v in value)
    return value


def _batches_on(batches: Sequence[Batch], count: int, device: torch.device, channels_last: bool) -> list[Batch]:
    # Moved once, before any timing: the bench measures training steps, not host-to-device copies.
    return [to_device(batches[i], device, channels_last) for i in range(min(count, len(batches)))]


def _guard(run: PolicyRun, what: str, fn: Any, *args: Any) -> None:
    if not run.alive:
        return
    try:
        fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # one policy's failure is a finding for its row, not the end of the bench
        log.warning("%s failed while %s: %s", run.precision, what, exc)
        run.fail(exc)


def _chunks(total: int, rounds: int) -> list[int]:
    rounds = max(1, min(rounds, total))
    base, extra = divmod(total, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def _mfu(result: BenchResult, device: torch.device) -> None:
    if device.type != "cuda":
        return  # no meaningful published peak for a CPU's mixed vector/matrix units
    for run in result.runs:
        if run.achieved_flops is None:
            continue
        policy = get_policy(run.precision)
        peak = peak_flops(result.device.get("name", ""), policy.compute_dtype, tf32=run.precision == "tf32")
        run.mfu = run.achieved_flops / peak if peak else None


def run_bench(
    workload: Workload,
    precisions: Sequence[str],
    device: torch.device | str = "cpu",
    *,
    seed: int = 0,
    rounds: int = 5,
    count_flops: bool = True,
    reporter: Reporter | None = None,
    command: str = "",
    settings: dict[str, Any] | None = None,
) -> BenchResult:
    """Train ``workload`` under each policy in ``precisions`` on ``device`` and return every figure.

    Policies are canonical names (resolve aliases with :func:`ampkit.get_policy` first). The reference
    (``32-true``) is compared against only if it is among them; the CLI always adds it.
    """
    device = as_device(device)
    # The runs reseed the global RNG; the caller's RNG state is theirs and comes back untouched.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return _run(workload, precisions, device, seed, rounds, count_flops, reporter or NullReporter(), command, settings or {})


def _run(
    workload: Workload,
    precisions: Sequence[str],
    device: torch.device,
    seed: int,
    rounds: int,
    count_flops: bool,
    reporter: Reporter,
    command: str,
    settings: dict[str, Any],
) -> BenchResult:
    steps, warmup = workload.steps, workload.warmup
    batches = _batches_on(workload.train_batches, steps, device, workload.channels_last)
    eval_batches = _batches_on(workload.eval_batches, len(workload.eval_batches), device, workload.channels_last)
    runs = [PolicyRun(workload, p, device, batches, seed) for p in precisions]
    for run in runs:  # the CLI refuses these up front; a library caller gets a row that says why
        support = get_policy(run.precision).support(device)
        if not support.supported:
            run.result.status, run.result.error = "unsupported", support.reason
    measure_steps = max(2, warmup)
    reporter.start(len(runs) * (measure_steps + steps + 1))

    for run in runs:  # 2. memory and FLOPs, each policy alone
        reporter.update(f"{run.precision}: measuring memory")
        _guard(run, "measuring memory", run.measure_alone, measure_steps, count_flops)
        reporter.update(f"{run.precision}: measuring memory", advance=measure_steps)

    for run in runs:  # 3. all runs alive, warmed up outside the timing
        reporter.update(f"{run.precision}: warm-up")
        _guard(run, "building", run.build)
        _guard(run, "warming up", run.train, warmup, False)
        reporter.update(f"{run.precision}: warm-up", advance=warmup)

    chunks = _chunks(steps - warmup, rounds)
    for r, chunk in enumerate(chunks):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]  # rotate who goes first each round
        for run in order:
            reporter.update(f"{run.precision}: round {r + 1}/{len(chunks)}")
            _guard(run, "training", run.train, chunk, True)
            reporter.update(f"{run.precision}: round {r + 1}/{len(chunks)}", advance=chunk)

    for run in runs:
        reporter.update(f"{run.precision}: evaluating")
        _guard(run, "summarising", run.summarize)  # first: a failing eval must not lose the training figures
        _guard(run, "evaluating", run.evaluate, eval_batches)
        run.release()
        reporter.update(f"{run.precision}: done", advance=1)
    reporter.finish()

    result = BenchResult(
        workload=workload.name,
        description=workload.description,
        command=command,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        ampkit=__version__,
        device=device_info(device),
        settings={"steps": steps, "warmup": warmup, "rounds": len(chunks), "seed": seed, **settings},
        workload_info=dict(workload.extra),
        reference=REFERENCE,
        runs=[run.result for run in runs],
    )
    tolerance = None
    if workload.metric is not None and eval_batches:
        m = workload.metric()
        tolerance = Tolerance(m.name, m.higher_is_better, m.tolerance, m.relative)
    apply_verdicts(result, tolerance)
    _mfu(result, device)
    return result
