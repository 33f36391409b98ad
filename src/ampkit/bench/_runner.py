"""The bench runner: one workload trained under several policies, side by side, measured fairly.

Fairness, step by step:

1. **Same start.** Every run trains a deep copy of the workload's model (same weights), on the same batches in
   the same order, with its own RNG seeded identically (same dropout masks).
2. **Memory alone.** Each policy first runs a few steps on a throwaway copy while no other run is alive, so its
   memory figures are its own: the CUDA allocator's peak, or on CPU the peak of live tensor bytes (``ampkit
   memory``'s definition), beside the exact bytes of parameters, gradients, optimizer state, masters and one
   micro-batch's saved activations (plus the process peak RSS). FLOPs are counted there too, by format for MFU.
3. **Time interleaved.** Then all runs are built, warmed up (untimed), and trained in rounds of equal chunks,
   the order rotating each round, so a machine that speeds up or slows down (turbo, a neighbour's job,
   thermal throttling) spreads over every policy instead of biasing the one that ran at that moment.
4. **Failures stay in their row.** An exception inside one policy's run marks that run failed; the rest go on.
5. **Compiled twins** (``compile=``): each policy also trains under ``Engine(compile=...)``, a run of its own in
   the same rounds. It compiles in step 2, alone; the time of those first steps less as many steady steps is its
   compile time, reported apart (:mod:`ampkit.bench._recipe`). A compile that fails is that row's failure.

**Under torchrun** (a process group is initialised when :func:`run_bench` is called, as ``ampkit bench --nproc N``
does) every run trains under DDP (``Engine(strategy="ddp")``) with strong scaling: the global batch stays the
workload's, each rank trains its ``1/N`` slice of the rows of every batch (tensors split along dim 0; the rows
must divide evenly), and DDP averages the gradients, so the loss curve is the single-process one (to ~1e-7 in
fp32 in the tests). Two model features make it differ slightly, as in any DDP run: BatchNorm normalises over
each rank's slice (torch's SyncBatchNorm runs on GPUs only), and each rank draws its own dropout masks. Figures
are combined at the end (:meth:`PolicyRun.summarize`): per-step loss averaged over ranks, step time the slowest
rank's, memory the largest rank's, FLOPs summed; rank 0 alone evaluates.

Every rank runs the same runs in the same order, so the collectives line up. After each phase of a run
(measure, build, warm-up, each chunk, summary) the ranks agree on whether it failed anywhere (one all-reduce of
one int); a run that raised on every rank, or on one rank after the phase's last collective, is then marked
failed on all of them and skipped. The limit: a rank that raises *between* the collectives of a step (in its
forward, while the others already wait in DDP's gradient all-reduce) leaves the ranks out of step; gloo then
detects the mismatched collective and aborts the whole run, NCCL leaves the others waiting until the process
group's timeout.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.workloads import Accuracy, Workload
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
import torch.distributed as dist

from .. import __version__
from .._errors import one_line
from .._util.model_io import to_device
from ..distributed._agreement import agree_max
from ..memory._fp8_layers import Fp8Plan, fp8_layer_plan, planned_policy
from ..policy import Policy, get_policy
from ..policy._device import as_device
from ..policy._fp8 import DEFAULT_TOKENS, FP8Policy
from ..training._micro_batching import batch_rows, split_batch
from ..workloads._device import device_info
from ..workloads._recipe import check_recipe
from ..workloads._workload import Batch, Workload
from ._flops import mfu
from ._policy_run import PolicyRun
from ._progress import NullReporter, Reporter
from ._recipe import recipe_settings, runs_to_build
from ._results import BenchResult
from ._verdict import Tolerance, apply_verdicts, check_tolerance

__all__ = ["REFERENCE", "check_shardable", "run_bench", "shard_batch"]

log = logging.getLogger("ampkit")

REFERENCE = "32-true"
"""The control every policy is compared with."""


def shard_batch(batch: Any, rank: int, world: int) -> Any:
    """This rank's slice of ``batch``: every tensor's rows ``[rank * n, (rank + 1) * n)`` with ``n = rows / world``.

    Every tensor with a batch dimension is sliced (views); 0-dim tensors and other values are shared as they are.

    >>> x, y = shard_batch((torch.arange(8).view(4, 2), torch.arange(4)), rank=1, world=2)
    >>> x.tolist(), y.tolist()
    ([[4, 5], [6, 7]], [2, 3])
    """
    if world == 1:
        return batch
    rows = batch_rows(batch)
    if rows % world:
        divisors = [d for d in range(2, min(rows, 64) + 1) if rows % d == 0][:4]
        hint = f" (--nproc {', '.join(map(str, divisors))})" if divisors else ""
        raise ValueError(
            f"a batch of {rows} rows does not split evenly over {world} processes: run a number of processes "
            f"that divides {rows}{hint}, or use a batch size divisible by {world}."
        )
    n = rows // world
    return split_batch(batch, rank * n, (rank + 1) * n)


def check_shardable(batches: Sequence[Batch], world: int, steps: int | None = None) -> None:
    """Raise ``ValueError`` naming the fix when the first ``steps`` batches do not split evenly over ``world`` ranks."""
    for i in range(min(steps or len(batches), len(batches))):
        shard_batch(batches[i], 0, world)


def _batches_on(batches: Sequence[Batch], count: int, device: torch.device, channels_last: bool, rank: int = 0, world: int = 1) -> list[Batch]:
    # Moved once, before any timing: the bench measures training steps, not host-to-device copies.
    return [to_device(shard_batch(batches[i], rank, world), device, channels_last) for i in range(min(count, len(batches)))]


def _guard(run: PolicyRun, what: str, fn: Any, *args: Any, world: int = 1) -> None:
    if not run.alive:
        return  # the same answer on every rank: the ranks agreed after the previous phase
    try:
        fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - one policy's failure is a finding for its row, not the end of the bench
        log.warning("%s failed while %s: %s", run.label, what, exc)
        run.fail(exc)
    if world > 1:
        _agree_on_failure(run, what, world)


def _agree_on_failure(run: PolicyRun, what: str, world: int) -> None:
    """A run that failed on any rank fails on all of them, so every rank skips it from here on (same collectives).

    One all-reduce when nothing failed; on a failure, one more gather so rank 0's row can say which rank and why.
    """
    failed_here = not run.alive
    if not agree_max(int(failed_here)):
        return
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, run.result.error if failed_here else None)
    if failed_here:
        return
    where, error = next((i, e) for i, e in enumerate(errors) if e is not None)
    log.warning("%s failed on rank %d while %s: %s", run.label, where, what, error)
    run.result.status, run.result.error = "failed", f"on rank {where}: {error}"
    run.release()


def _chunks(total: int, rounds: int) -> list[int]:
    rounds = max(1, min(rounds, total))
    base, extra = divmod(total, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def _mfu(result: BenchResult, world: int = 1) -> None:
    """Each GPU run's MFU, or the reason it has none (:func:`ampkit.bench._flops.mfu`: one definition for every row)."""
    if result.device.get("type") != "cuda":
        return  # no meaningful published peak for a CPU's mixed vector/matrix units
    for run in result.runs:
        if not run.flops_by_format or not run.step_time_median_s:
            continue
        # flops_by_format counts every rank's FLOPs, so over the peaks of all `world` GPUs.
        run.mfu, run.mfu_note = mfu(run.flops_by_format, run.step_time_median_s, result.device.get("name", ""), world)


def run_bench(
    workload: Workload,
    precisions: Sequence[str | Policy],
    device: torch.device | str = "cpu",
    *,
    seed: int = 0,
    rounds: int = 5,
    count_flops: bool = True,
    reporter: Reporter | None = None,
    command: str = "",
    settings: dict[str, Any] | None = None,
    tolerance: float | None = None,
    compile: Any = None,
) -> BenchResult:
    """Train ``workload`` under each policy in ``precisions`` on ``device`` and return every figure.

    ``precisions``: Policy objects, run as they are, or names and aliases, each made a Policy here, once; a name
    that is no policy raises PolicyError. The reference (``32-true``) is compared against only if it is among them;
    the CLI always adds it.

    With a process group initialised (under torchrun) every rank must call it with the same arguments; the runs
    train under DDP on each rank's slice of the batches, and rank 0's result holds the combined figures (see the
    module's docstring). ``device`` is this rank's device.

    ``tolerance`` replaces the eval metric's own tolerance, in the metric's terms (absolute for accuracy and
    mIoU, a fraction of the reference for perplexity and eval loss); a ValueError when it is not a non-negative
    finite number or the workload has no eval metric.

    ``compile`` (what ``Engine(compile=...)`` takes: True, ``"regional"``, a dict of torch.compile options) adds
    each policy's compiled twin, trained beside it in the same rounds (see :mod:`ampkit.bench._recipe`). The
    workload's ``accumulate`` and ``clip_grad_norm`` apply to every run.
    """
    policies = [get_policy(p) for p in precisions]  # the API's edge: below it only Policy objects travel
    check_recipe(workload)
    runs_to_build([], compile)  # a compile spec torch.compile cannot take is refused before anything runs
    if tolerance is not None:
        check_tolerance(tolerance)
        if workload.metric is None or not workload.eval_batches:
            raise ValueError(f"a tolerance was given, but workload {workload.name!r} has no eval metric to hold to it; drop the tolerance.")
    device = as_device(device)
    # The runs reseed the global RNG; the caller's RNG state is theirs and comes back untouched.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        recipe = recipe_settings(workload, compile, tolerance, _rows(workload.train_batches[0]))
        runs = runs_to_build(policies, compile)
        result = _run(workload, runs, compile, device, seed, rounds, count_flops, reporter or NullReporter(), command, {**recipe, **(settings or {})})
    _judge(result, workload, tolerance, policies)
    return result


def _judge(result: BenchResult, workload: Workload, amount: float | None, policies: Sequence[Policy]) -> None:
    """The verdicts, against the workload's metric tolerance or ``amount`` in its place, of the runs of ``policies``."""
    tolerance = None
    if workload.metric is not None and workload.eval_batches:
        m = workload.metric()
        tolerance = Tolerance(m.name, m.higher_is_better, m.tolerance, m.relative)
        tolerance = tolerance if amount is None else tolerance.with_amount(amount)
        try:
            result.eval_samples = sum(batch_rows(b) for b in workload.eval_batches)
        except ValueError:
            result.eval_samples = None  # batches without one sample dimension: the count is left unsaid
    apply_verdicts(result, tolerance, {p.name: p for p in policies})


def _rows(batch: Batch) -> int | None:
    try:
        return batch_rows(batch)
    except ValueError:
        return None  # a batch without one sample dimension: the count is left unsaid


def _fp8_plans(workload: Workload, runs: Sequence[PolicyRun]) -> dict[str, Fp8Plan]:
    """Plan each fp8 policy's layers at the workload's rows per batch, and have its runs convert what the plan says."""
    plans: dict[str, Fp8Plan] = {}
    unplanned: set[str] = set()
    for run in runs:
        if run.result.status != "unsupported" and isinstance(run.policy, FP8Policy) and run.precision not in unplanned:
            if run.precision not in plans:
                try:
                    plans[run.precision] = fp8_layer_plan(workload.model, workload.train_batches[0], run.policy)
                except Exception as exc:  # noqa: BLE001 - a forward fake tensors cannot run: the run goes on with the policy's defaults
                    log.warning("could not plan %s's layers from the batch (%s); it converts the layers its filter picks at "
                                "%d rows", run.precision, one_line(exc, with_type=True), DEFAULT_TOKENS)
                    unplanned.add(run.precision)
                    continue
            run.policy = planned_policy(plans[run.precision], run.policy)
    return plans


def _run(
    workload: Workload,
    to_build: Sequence[tuple[Policy, str | None]],
    compile: Any,
    device: torch.device,
    seed: int,
    rounds: int,
    count_flops: bool,
    reporter: Reporter,
    command: str,
    settings: dict[str, Any],
) -> BenchResult:
    steps, warmup = workload.steps, workload.warmup
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    strategy = "ddp" if distributed else None
    batches = _batches_on(workload.train_batches, steps * workload.accumulate, device, workload.channels_last, rank, world)
    # Rank 0 alone evaluates (the whole eval set): the others need no copy of it.
    eval_batches = _batches_on(workload.eval_batches, len(workload.eval_batches), device, workload.channels_last) if rank == 0 else []
    runs = [
        PolicyRun(workload, p, device, batches, seed, strategy=strategy, rank=rank, world=world, compile=compile if mode else None, mode=mode)
        for p, mode in to_build
    ]
    for run in runs:  # the CLI refuses these up front; a library caller gets a row that says why
        support = run.policy.support(device)
        if not support.supported:
            run.result.status, run.result.error = "unsupported", support.reason
    fp8_plans = _fp8_plans(workload, runs)
    measure_steps = max(2, warmup)
    reporter.start(len(runs) * (measure_steps + steps + 1))

    for run in runs:  # what a run compiles, said where it starts (a region's first compile can take a minute on a GPU)
        run.on_phase = lambda phase, label=run.label: reporter.update(f"{label}: {phase}")
    for run in runs:  # 2. memory and FLOPs, each policy alone
        reporter.update(f"{run.label}: measuring memory")
        _guard(run, "measuring memory", run.measure_alone, measure_steps, count_flops, world=world)
        reporter.update(f"{run.label}: measuring memory", advance=measure_steps)

    eager = {run.precision: run.result for run in runs if run.compile is None}
    for run in runs:  # a compiled twin does the eager run's math: its FLOPs are counted once, eagerly
        if run.compile is not None:
            counted = eager[run.precision]
            run.result.flops_per_step, run.result.recomputed_flops = counted.flops_per_step, counted.recomputed_flops
            run.result.flops_by_format = dict(counted.flops_by_format)

    for run in runs:  # 3. all runs alive, warmed up outside the timing
        reporter.update(f"{run.label}: warm-up")
        _guard(run, "building", run.build, world=world)
        _guard(run, "warming up", run.train, warmup, False, world=world)
        reporter.update(f"{run.label}: warm-up", advance=warmup)

    chunks = _chunks(steps - warmup, rounds)
    for r, chunk in enumerate(chunks):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]  # rotate who goes first each round
        for run in order:
            reporter.update(f"{run.label}: round {r + 1}/{len(chunks)}")
            _guard(run, "training", run.train, chunk, True, world=world)
            reporter.update(f"{run.label}: round {r + 1}/{len(chunks)}", advance=chunk)

    for run in runs:
        reporter.update(f"{run.label}: evaluating")
        _guard(run, "summarising", run.summarize, world=world)  # first: a failing eval must not lose the training figures
        _guard(run, "evaluating", run.evaluate, eval_batches)  # rank 0 only, no collective: nothing to agree on
        run.release()
        reporter.update(f"{run.label}: done", advance=1)
    reporter.finish()

    result = BenchResult(
        workload=workload.name,
        description=workload.description,
        command=command,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        ampkit=__version__,
        device=device_info(device),
        settings={"steps": steps, "warmup": warmup, "rounds": len(chunks), "seed": seed, "nproc": world, "strategy": strategy, **settings},
        workload_info=dict(workload.extra),
        reference=REFERENCE,
        fp8_layers={name: plan.to_dict() for name, plan in fp8_plans.items()},
        runs=[run.result for run in runs],
    )
    _mfu(result, world)
    return result
