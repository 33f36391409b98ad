"""A bench run's figures from what its timed steps recorded: the final loss, the step-time median and spread,
throughput, FLOP/s and compile time; under torchrun, every rank's record combined first, in one collective.

:class:`~ampkit.bench._policy_run.PolicyRun` records per step (losses, times, whether torch.compile compiled during
the step) and calls :func:`summarize_run` once, after training: this module reads those records and fills the
:class:`~ampkit.bench._results.RunResult`'s figures, touching nothing else.

    >>> r = RunResult(precision="32-true")
    >>> summarize_run(r, [2.0, 1.0], [0.5, 0.1, 0.1, 0.1], [True, False, False, False], first_steps=[], items_per_step=32)
    >>> r.final_loss, r.timed_steps, r.throughput, r.compiling_steps, r.compile_time_s
    (1.0, 3, 320.0, 1, 0.4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from ..workloads._timing import summarize
from ._results import RunResult

__all__ = ["combine_ranks", "summarize_run"]


def summarize_run(
    r: RunResult,
    losses: list[float],
    times: list[float],
    compiled: list[bool],
    *,
    first_steps: Sequence[float] = (),
    items_per_step: float,
    world: int = 1,
) -> None:
    """Fill ``r``'s loss and time figures: ``losses`` per step (on the host), ``times`` per timed step, ``compiled``
    parallel to them (a step torch.compile compiled in, left out of the times: compilation, not a step), and a
    compiled run's ``first_steps`` (where it compiled). ``items_per_step``: samples or tokens of one global step.

    Under DDP (``world`` > 1) every rank must call it (one ``all_gather_object``, :func:`combine_ranks`): the loss of a
    step is the mean of the ranks' losses (each the mean over its equal slice, so the mean over the global batch), a
    step's time is the slowest rank's, memory figures are the largest any rank reached, and FLOPs are summed over the
    ranks.
    """
    if world > 1:
        losses, times, compiled = combine_ranks(r, losses, times, compiled, world)
    compiling = [t for t, c in zip(times, compiled) if c]
    r.compiling_steps = len(compiling)
    if len(compiling) == len(times):
        compiling = []  # nothing steady to time instead: the times stay, and the row's note says they compiled
    else:
        times = [t for t, c in zip(times, compiled) if not c]
    if losses:
        r.losses = list(losses)
        tail = losses[-max(1, len(losses) // 10) :]
        r.final_loss = sum(tail) / len(tail)
        if not math.isfinite(r.final_loss):
            r.status = "diverged"
    if times:
        stats = summarize(times)
        r.step_time_median_s, r.step_time_p10_s, r.step_time_p90_s = stats["median"], stats["p10"], stats["p90"]
        r.timed_steps, r.step_times_s = len(times), list(times)
        # The global batch (every rank's rows) of every micro-batch of the step.
        r.throughput = items_per_step / stats["median"]
        if r.flops_per_step is not None:
            r.achieved_flops = r.flops_per_step / stats["median"]
        if first_steps:
            r.compile_time_s = max(0.0, sum(first_steps) - len(first_steps) * stats["median"])
        if compiling:
            compiling_s = max(0.0, sum(compiling) - len(compiling) * stats["median"])
            r.compile_time_s = (r.compile_time_s or 0.0) + compiling_s


def combine_ranks(
    r: RunResult, losses: list[float], times: list[float], compiled: list[bool], world: int
) -> tuple[list[float], list[float], list[bool]]:
    """Every rank's losses, times, memory and FLOPs in one collective: the memory and FLOP figures are written to ``r``;
    returns the combined losses, times and compiled flags."""
    mine = {
        "losses": losses, "times": times, "flops": r.flops_per_step, "peak": r.peak_memory_bytes,
        "activations": r.activation_bytes, "rss": r.peak_rss_bytes, "breakdown": r.memory_breakdown,
        "by_format": r.flops_by_format, "recomputed": r.recomputed_flops, "compiled": compiled,
    }
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    if len({len(g["losses"]) for g in ranks}) != 1 or len({len(g["times"]) for g in ranks}) != 1:
        raise RuntimeError(f"the ranks recorded different step counts ({[len(g['losses']) for g in ranks]}); every rank must train the same steps.")
    losses = [sum(step) / world for step in zip(*(g["losses"] for g in ranks))]
    times = [max(step) for step in zip(*(g["times"] for g in ranks))]  # the slowest rank sets the pace
    compiled = [any(step) for step in zip(*(g["compiled"] for g in ranks))]  # a step any rank compiled in

    def largest(key: str) -> int | None:
        values = [g[key] for g in ranks if g[key] is not None]
        return max(values) if values else None

    r.peak_memory_bytes, r.activation_bytes, r.peak_rss_bytes = largest("peak"), largest("activations"), largest("rss")
    keys = dict.fromkeys(k for g in ranks for k in g["breakdown"])  # ordered, rank 0's first
    r.memory_breakdown = {k: max(g["breakdown"].get(k, 0) for g in ranks) for k in keys}
    flops = [g["flops"] for g in ranks]
    if all(f is not None for f in flops):  # each rank counted its own slice: the step's FLOPs are their sum
        r.flops_per_step = float(sum(flops))
        formats = dict.fromkeys(k for g in ranks for k in g["by_format"])
        r.flops_by_format = {k: float(sum(g["by_format"].get(k, 0.0) for g in ranks)) for k in formats}
        r.recomputed_flops = float(sum(g["recomputed"] or 0.0 for g in ranks))
    else:
        r.flops_per_step, r.flops_by_format, r.recomputed_flops = None, {}, None
    return losses, times, compiled
