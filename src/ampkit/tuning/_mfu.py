"""MFU of a tune's configurations: ``ampkit bench``'s definition, on the same FLOP counter, for the tune's table.

One definition for both tools (:func:`ampkit.bench._flops.mfu`): the time the step's useful FLOPs would take at the
GPU's dense peak for the format each ran in, over the measured median step (compile time kept out, as the bench
keeps it out). The FLOPs are those ``ampkit bench`` counts (:func:`ampkit.bench._flops.count_flops`, torch's
``FlopCounterMode``): one eager optimizer step of the configuration's policy at its micro-batch, every micro-batch
of the global batch included. Compile, the fused step, recompute and threads do not change the useful FLOPs (a
recomputed forward is counted apart, not as useful work), so a compiled candidate's FLOPs are its eager twin's, as
the bench copies a compiled run's count from its eager run (:func:`ampkit.tuning._trials.step_flops` counts it). Counted only where the device's peak is known (a listed
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

from collections.abc import Mapping
from typing import Any

from ..bench._flops import mfu
from ..policy._gpu_specs import gpu_spec
from ._space import Candidate

__all__ = ["counts_flops", "eager_twin", "flops_key", "row_mfu"]


def counts_flops(device: Mapping[str, Any]) -> bool:
    """Whether a tune on ``device`` (:func:`ampkit.workloads.device_info`'s dict) counts FLOPs: only where a dense
    peak is known for it, since MFU is the one figure they serve."""
    return gpu_spec(str(device.get("name", ""))) is not None


def eager_twin(c: Candidate) -> Candidate:
    """The configuration whose eager step does ``c``'s useful math: same policy and micro-batches, nothing else."""
    return Candidate(policy=c.policy, micro_batch=c.micro_batch, accumulate=c.accumulate, keep_fp32=c.keep_fp32)


def flops_key(c: Candidate) -> str:
    """What the useful FLOPs of a step depend on: the policy and the modules it keeps in fp32 (the formats; an fp8
    plan is made per micro-batch's rows) and the micro-batches."""
    return eager_twin(c).key


def row_mfu(flops_by_format: Mapping[str, float], median_s: float | None, device: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """``(MFU, None)`` of a configuration whose step does ``flops_by_format`` in ``median_s`` on ``device``, or
    ``(None, why)``: the bench's :func:`~ampkit.bench._flops.mfu`, on one device."""
    if not counts_flops(device):
        return None, "no dense peak is known for this device"
    if not flops_by_format or not median_s:
        return None, "FLOPs not counted" if not flops_by_format else "no timed step"
    value, why = mfu(flops_by_format, median_s, str(device.get("name", "")))
    return value, (why.removeprefix("MFU n/a: ") if why else None)

