"""FLOPs of a training step, by the number format each matmul ran in, and the MFU they give on a known GPU.

One definition of MFU for every policy: the time the step's useful FLOPs would take if each ran at the GPU's
dense peak for its format (fp8, 16-bit, TF32 or fp32 tensor math), over the measured step time. For a step whose
matmuls all run in one format that is the familiar achieved FLOP/s over that format's peak; bf16-true and
bf16-mixed are both held to the 16-bit peak, 32-true to the fp32 peak, or the TF32 one for the ops torch let
run in TF32 (cuDNN convolutions do by default), fp8 layers to the fp8 peak and the rest of an fp8 model to the
16-bit one. The format is read op by op as the step runs (the dtype the op multiplies, and for fp32 ops
torch's TF32 settings at that moment), not from the policy's name.

Useful FLOPs are those of the forward and backward passes torch counts (``FlopCounterMode``'s formulas:
matmuls, convolutions, attention): about 3x the forward's matmul FLOPs (the backward computes the gradients of
the inputs and of the weights; none for an input that needs no gradient). A forward recomputed during backward
(activation checkpointing) is counted apart, in :attr:`StepFlops.recomputed`, and not as useful work: MFU, not
hardware FLOP utilisation. An MFU above 100% cannot be measured; :func:`mfu` gives a reason instead of the figure.

    >>> from torch import nn
    >>> model, x = nn.Linear(64, 32), torch.randn(16, 64, requires_grad=True)
    >>> flops = count_flops(lambda: model(x).sum().backward())
    >>> flops.by_format, flops.total == 3 * (2 * 16 * 64 * 32)
    ({'fp32': 196608}, True)
    >>> mfu({"16-bit": 989.4e12 * 0.01}, 0.02, "NVIDIA H200")  # 10 ms of work at the bf16 peak in a 20 ms step
    (0.5, None)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from .._compat import TorchDispatchMode, cuda_allows_tf32, in_backward_node
from ..policy._gpu_specs import GpuSpec, gpu_spec

__all__ = ["FORMATS", "StepFlops", "count_flops", "mfu", "peak_flops"]

FORMATS = ("fp8", "16-bit", "tf32", "fp32", "other")
"""What a counted op multiplied in: ``other`` is a format no peak is listed for (fp64, integers, or FLOPs that
torch's counter saw but whose op could not be told, e.g. inside a higher-order op)."""


@dataclass(frozen=True)
class StepFlops:
    """The FLOPs of one training step: useful work by format, and the recomputation left out of it."""

    by_format: dict[str, int] = field(default_factory=dict)
    """Useful FLOPs (forward and backward) per format of :data:`FORMATS`; formats with none are absent."""
    recomputed: int = 0
    """FLOPs of forwards run again during backward (activation checkpointing): done, but not useful work."""

    @property
    def total(self) -> int:
        """The useful FLOPs: the sum over formats."""
        return sum(self.by_format.values())


def _on_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"  # TF32 is a CUDA mode: a CPU op multiplies fp32 in fp32 whatever CUDA's settings


def _format(func: Any, args: tuple[Any, ...]) -> str:
    t = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
    if t is None:
        return "other"
    if t.dtype.itemsize == 1:  # the float8 dtypes (torch._scaled_mm's operands)
        return "fp8"
    if t.dtype in (torch.float16, torch.bfloat16):
        return "16-bit"
    if t.dtype == torch.float32:
        # Read when the op runs: the tf32 policy sets TF32 around its forward only, so its backward runs in fp32.
        op = "conv" if "conv" in func._overloadpacket.__name__ else "matmul"
        return "tf32" if _on_cuda(t) and cuda_allows_tf32(op) else "fp32"
    return "other"


class _ByFormat(TorchDispatchMode):
    """Below torch's FlopCounterMode: files each counted op's FLOPs under its format, or as recomputation."""

    def __init__(self) -> None:
        super().__init__()
        self.by_format: dict[str, int] = defaultdict(int)
        self.recomputed = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            # Backward ops run with grad mode off; a forward recomputed inside backward (checkpoint) runs with it on.
            if in_backward_node() and torch.is_grad_enabled():
                self.recomputed += flops
            else:
                self.by_format[_format(func, args)] += flops
        return out


def count_flops(step: Callable[[], object]) -> StepFlops:
    """The FLOPs torch counts while ``step()`` runs (matmuls, convolutions, attention; forward and backward), by format.

    Torch's ``FlopCounterMode`` gives the total; what it counts that the format counter did not see goes under
    ``other``, so an op of unknown format never lands under a format's peak.

    >>> a = torch.randn(8, 16, requires_grad=True)
    >>> count_flops(lambda: (a @ torch.randn(16, 4)).sum().backward()).total  # 2*8*16*4 forward + the same for grad a
    2048
    """
    formats = _ByFormat()
    with formats, FlopCounterMode(display=False) as counter:  # the counter above, so it sees each op first
        step()
    by_format = {f: formats.by_format[f] for f in FORMATS if formats.by_format.get(f)}
    unseen = int(counter.get_total_flops()) - sum(by_format.values()) - formats.recomputed
    if unseen > 0:
        by_format["other"] = by_format.get("other", 0) + unseen
    return StepFlops(by_format, formats.recomputed)


def _peak_tflops(spec: GpuSpec, fmt: str) -> float | None:
    return {"fp8": spec.fp8_tflops, "16-bit": spec.bf16_tflops, "tf32": spec.tf32_tflops, "fp32": spec.fp32_tflops}.get(fmt)


def peak_flops(device_name: str, fmt: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` (``torch.cuda.get_device_name()``) for ``fmt`` of :data:`FORMATS`.

    None when the GPU is not listed (:mod:`ampkit.policy._gpu_specs`) or has no peak for the format.

    >>> peak_flops("NVIDIA H100 80GB HBM3", "16-bit") / 1e12, peak_flops("Some Future GPU", "16-bit")
    (989.4, None)
    """
    spec = gpu_spec(device_name)
    tflops = _peak_tflops(spec, fmt) if spec is not None else None
    return tflops * 1e12 if tflops is not None else None


def mfu(flops_by_format: Mapping[str, float], step_seconds: float, device_name: str, devices: int = 1) -> tuple[float | None, str | None]:
    """``(MFU, None)``, or ``(None, why there is none)``: the step's FLOPs at the dense peaks over the step time.

    ``flops_by_format`` are one step's useful FLOPs (every process's, under DDP), ``step_seconds`` its time and
    ``devices`` how many GPUs ran it. A figure above 1 is impossible, so it is never returned: the reason says
    the peak or the count is wrong.

    >>> mfu({"16-bit": 2.23e12}, 0.0122, "NVIDIA H200")[0]   # the first H200 run's bf16-true row: not 273%
    0.18474...
    >>> mfu({"16-bit": 2.23e12}, 0.0122, "NVIDIA X9")[1]
    "MFU n/a: no dense peak is known for 'NVIDIA X9' (ampkit/policy/_gpu_specs.py lists the GPUs it knows)"
    """
    spec = gpu_spec(device_name)
    if spec is None:
        return None, f"MFU n/a: no dense peak is known for {device_name!r} (ampkit/policy/_gpu_specs.py lists the GPUs it knows)"
    ideal = 0.0
    for fmt, flops in flops_by_format.items():
        if not flops:
            continue
        peak = _peak_tflops(spec, fmt)
        if peak is None:
            return None, f"MFU n/a: {spec.name} has no listed peak for the step's {fmt} FLOPs"
        ideal += flops / (peak * 1e12)
    value = ideal / (step_seconds * devices)
    if value > 1.0:
        return None, (f"MFU n/a: {value:.0%} of {spec.name}'s dense peak is impossible: the peak listed for this GPU "
                      "or the FLOP count is wrong")
    return value, None
