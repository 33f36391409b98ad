"""MFU of a tune's configurations: ``ampkit bench``'s definition, on the same FLOP counter, for the tune's table.

One definition for both tools (:func:`ampkit.bench._flops.mfu`): the time the step's useful FLOPs would take at the
GPU's dense peak for the format each ran in, over the measured median step (compile time kept out, as the bench
keeps it out). The FLOPs are those ``ampkit bench`` counts (:func:`ampkit.bench._flops.count_flops`, torch's
``FlopCounterMode``): one eager optimizer step of the configuration's policy at its micro-batch, every micro-batch
of the global batch included. Compile, the fused step, recompute and threads do not change the useful FLOPs (a
recomputed forward is counted apart, not as useful work), so a compiled candidate's FLOPs are its eager twin's, as
the bench copies a compiled run's count from its eager run. Counted only where the device's peak is known (a listed
GPU): elsewhere the column shows ``-`` and nothing is counted.

    >>> c = Candidate(policy="bf16-mixed", micro_batch=4, accumulate=2, compile="model", fused_step=True, recompute=True)
    >>> eager_twin(c).key
    'bf16-mixed mb4x2 compile=off'
    >>> row_mfu({"16-bit": 989.4e12 * 0.01}, 0.02, {"type": "cuda", "name": "NVIDIA H200"})  # 10 ms at the peak, 20 ms steps
    (0.5, None)
    >>> row_mfu({"fp32": 1e9}, 0.02, {"type": "cpu", "name": "Intel Xeon"})
    (None, 'no dense peak is known for this device')
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from .._errors import one_line
from ..bench._flops import mfu
from ..policy._gpu_specs import gpu_spec
from ..workloads import Workload
from ._space import Candidate

__all__ = ["counts_flops", "eager_twin", "flops_key", "row_mfu", "step_flops"]

log = logging.getLogger("ampkit")


def counts_flops(device: Mapping[str, Any]) -> bool:
    """Whether a tune on ``device`` (:func:`ampkit.workloads.device_info`'s dict) counts FLOPs: only where a dense
    peak is known for it, since MFU is the one figure they serve."""
    return gpu_spec(str(device.get("name", ""))) is not None


def eager_twin(c: Candidate) -> Candidate:
    """The configuration whose eager step does ``c``'s useful math: same policy and micro-batches, nothing else."""
    return Candidate(policy=c.policy, micro_batch=c.micro_batch, accumulate=c.accumulate)


def flops_key(c: Candidate) -> str:
    """What the useful FLOPs of a step depend on: the policy (the formats; an fp8 plan is made per micro-batch's rows)
    and the micro-batches."""
    return eager_twin(c).key


def step_flops(workload: Workload, c: Candidate, device: torch.device, seed: int) -> dict[str, float]:
    """The useful FLOPs of one optimizer step of ``c``, by format, counted eagerly on a throwaway copy of its eager
    twin (the bench's :meth:`ampkit.bench.PolicyRun.measure_alone`); {} when the counter failed (logged)."""
    from ._trials import make_run  # deferred: _trials imports this module

    try:
        run = make_run(workload, eager_twin(c), device, seed, 2)
        try:
            run.measure_alone(2, True)
        finally:
            run.release()
    except Exception as exc:  # noqa: BLE001 - no count is a "-" in one column, never a failed trial
        log.warning("tune: FLOPs of %s not counted (%s)", c.key, one_line(exc, with_type=True))
        return {}
    return dict(run.result.flops_by_format)


def row_mfu(flops_by_format: Mapping[str, float], median_s: float | None, device: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """``(MFU, None)`` of a configuration whose step does ``flops_by_format`` in ``median_s`` on ``device``, or
    ``(None, why)``: the bench's :func:`~ampkit.bench._flops.mfu`, on one device."""
    if not counts_flops(device):
        return None, "no dense peak is known for this device"
    if not flops_by_format or not median_s:
        return None, "FLOPs not counted" if not flops_by_format else "no timed step"
    value, why = mfu(flops_by_format, median_s, str(device.get("name", "")))
    return value, (why.removeprefix("MFU n/a: ") if why else None)

