"""Which Linear layers pay in fp8: a roofline of each layer's training step in bf16 and in fp8, from shapes alone.

fp8 halves a matmul's time at best (twice the tensor-core peak, half the bytes), but every fp8 matmul first casts
its operands: one pass reads the tensor for its absolute maximum (the dynamic scale), a second reads it again and
writes it in 8 bits. Those casts are memory-bound and grow with the layer's area, not its volume, so a small layer
loses what a large one wins. This module predicts both times for one ``nn.Linear`` at ``M`` tokens (rows of its
input), ``K`` input and ``N`` output features, under ``bf16-mixed`` (fp32 weights, bf16 autocast) and under
torchao's float8 training on top of it:

* **Matmuls** (forward ``Y = X W^T``, grad input ``dX = dY W``, grad weight ``dW = dY^T X``; ``2MNK`` FLOPs each):
  each takes ``max(FLOPs / peak, bytes / bandwidth)``, the roofline. In bf16 every operand and output is 2 bytes;
  in fp8 the two operands are 1 byte and the output 2.
* **Casts** (memory only): bf16 pays autocast's fp32-to-bf16 copy of the weight (read 4, write 2 bytes per
  element) once per step. fp8 casts each operand for each of the two matmuls it enters, as torchao's autograd
  function does: the input and the output gradient (bf16: read 2 for the amax, read 2 and write 1 for the cast)
  and the fp32 weight (read 4, read 4, write 1), so ``2 * (5MK + 5MN + 9NK)`` bytes.
* Both paths write the weight gradient in bf16 and cast it to the fp32 ``.grad`` (read 2, write 4).

Launch overheads are left out: the model assumes ``torch.compile``, without which torchao's fp8 is slower than
bf16 at every size. The two recipes cost the same here (row-wise scales are ``M`` floats); row-wise kernels reach
a smaller share of peak, which only a measurement shows (the GPU suite's ``fp8`` step). fp8 also needs both
dimensions to be multiples of 16 (``torch._scaled_mm``'s rule).

    >>> from ampkit.policy._gpu_specs import gpu_spec
    >>> h100 = gpu_spec("H100")
    >>> round(predict_linear(h100, tokens=8192, in_features=4096, out_features=14336).speedup, 2)  # an 8B MLP
    1.34
    >>> predict_linear(h100, tokens=1024, in_features=768, out_features=768).pays  # a GPT-2 small projection
    False
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._fp8_matmuls import matmul_layers
from ._gpu_specs import GpuSpec

__all__ = ["FP8_MULTIPLE", "LayerCost", "LinearCost", "fp8_fits", "measure_linear_tokens", "predict_linear", "predict_model"]

FP8_MULTIPLE = 16
"""Both dimensions of an fp8 matmul's operands must be multiples of this (``torch._scaled_mm``)."""

_BF16, _FP8, _FP32 = 2, 1, 4
_HIGH_CAST = _BF16 + _BF16 + _FP8  # a bf16 tensor to fp8: read for the amax, read again and write 8 bits
_WEIGHT_CAST = _FP32 + _FP32 + _FP8  # the fp32 weight to fp8, the same two passes


@dataclass(frozen=True, slots=True)
class LinearCost:
    """Predicted time of one Linear layer's forward and backward, in bf16 and in fp8 (seconds)."""

    tokens: int
    in_features: int
    out_features: int
    fits: bool
    """Both dimensions are multiples of :data:`FP8_MULTIPLE`, so fp8 kernels accept the layer."""
    bf16_s: float
    fp8_matmul_s: float
    fp8_cast_s: float

    @property
    def fp8_s(self) -> float:
        return self.fp8_matmul_s + self.fp8_cast_s

    @property
    def speedup(self) -> float:
        """bf16 time over fp8 time: above 1, fp8 is predicted faster."""
        return self.bf16_s / self.fp8_s

    @property
    def pays(self) -> bool:
        """fp8 kernels accept the layer and it is predicted faster in fp8."""
        return self.fits and self.speedup > 1.0


@dataclass(frozen=True, slots=True)
class LayerCost:
    """A named Linear layer of a model and its prediction."""

    name: str
    cost: LinearCost


def fp8_fits(in_features: int, out_features: int) -> bool:
    """Whether fp8 matmul kernels accept a Linear of these dimensions.

    >>> fp8_fits(768, 3072), fp8_fits(768, 50257)
    (True, False)
    """
    return in_features % FP8_MULTIPLE == 0 and out_features % FP8_MULTIPLE == 0


def _matmul_s(flops: float, nbytes: float, peak_tflops: float, bandwidth_tbs: float) -> float:
    return max(flops / (peak_tflops * 1e12), nbytes / (bandwidth_tbs * 1e12))


def predict_linear(spec: GpuSpec, tokens: int, in_features: int, out_features: int) -> LinearCost:
    """The roofline of one Linear's training step on ``spec``'s GPU (see the module's docstring for the model).

    >>> from ampkit.policy._gpu_specs import gpu_spec
    >>> c = predict_linear(gpu_spec("H100"), tokens=16384, in_features=8192, out_features=8192)
    >>> c.fits, round(c.bf16_s * 1e3, 3), round(c.fp8_s * 1e3, 3)
    (True, 6.908, 4.616)
    """
    if spec.fp8_tflops is None:
        raise ValueError(f"{spec.name} has no fp8 tensor cores: nothing to predict (fp8 needs an Ada, Hopper or Blackwell GPU).")
    if min(tokens, in_features, out_features) <= 0:
        raise ValueError(f"tokens, in_features and out_features must be positive, got {tokens}, {in_features}, {out_features}.")
    m, k, n = tokens, in_features, out_features
    flops = 2.0 * m * n * k
    bw = spec.bandwidth_tbs * 1e12
    grad_to_fp32 = (_BF16 + _FP32) * n * k  # the bf16 weight gradient copied into the fp32 .grad, on both paths
    bf16_matmuls = (
        _matmul_s(flops, _BF16 * (m * k + n * k + m * n), spec.bf16_tflops, spec.bandwidth_tbs)  # forward
        + _matmul_s(flops, _BF16 * (m * n + n * k + m * k), spec.bf16_tflops, spec.bandwidth_tbs)  # grad input
        + _matmul_s(flops, _BF16 * (m * n + m * k + n * k), spec.bf16_tflops, spec.bandwidth_tbs)  # grad weight
    )
    bf16_s = bf16_matmuls + ((_FP32 + _BF16) * n * k + grad_to_fp32) / bw  # autocast's weight copy, the grad copy
    fp8_matmul_s = (
        _matmul_s(flops, _FP8 * (m * k + n * k) + _BF16 * m * n, spec.fp8_tflops, spec.bandwidth_tbs)
        + _matmul_s(flops, _FP8 * (m * n + n * k) + _BF16 * m * k, spec.fp8_tflops, spec.bandwidth_tbs)
        + _matmul_s(flops, _FP8 * (m * n + m * k) + _BF16 * n * k, spec.fp8_tflops, spec.bandwidth_tbs)
    )
    fp8_cast_s = (2 * (_HIGH_CAST * m * k + _HIGH_CAST * m * n + _WEIGHT_CAST * n * k) + grad_to_fp32) / bw
    return LinearCost(m, k, n, fp8_fits(k, n), bf16_s, fp8_matmul_s, fp8_cast_s)


def predict_model(model: nn.Module, spec: GpuSpec, tokens: int | Mapping[str, int]) -> list[LayerCost]:
    """The prediction for every ``nn.Linear`` (and Hugging Face ``Conv1D``, :mod:`~ampkit.policy._fp8_matmuls`) in
    ``model``, by name; ``tokens`` is one count for all, or per name.

    Layers missing from a ``tokens`` mapping (a forward never reached them) are left out.

    >>> from ampkit.policy._gpu_specs import gpu_spec
    >>> model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
    >>> [(r.name, r.cost.pays) for r in predict_model(model, gpu_spec("H100"), tokens=8192)]
    [('0', True), ('2', False)]
    """
    rows = []
    for layer in matmul_layers(model):
        m = tokens.get(layer.name) if isinstance(tokens, Mapping) else tokens
        if m is None:
            continue
        rows.append(LayerCost(layer.name, predict_linear(spec, m, layer.in_features, layer.out_features)))
    return rows


def measure_linear_tokens(model: nn.Module, forward: Callable[[], Any]) -> dict[str, int]:
    """The rows each ``nn.Linear`` (and Hugging Face ``Conv1D``) of ``model`` multiplies when ``forward()`` runs (the
    largest, if called twice).

    >>> model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    >>> measure_linear_tokens(model, lambda: model(torch.zeros(2, 5, 8)))
    {'0': 10, '1': 10}
    """
    seen: dict[str, int] = {}
    handles = []
    for layer in matmul_layers(model):
        def record(mod: nn.Module, args: tuple[Any, ...], name: str = layer.name) -> None:
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                seen[name] = max(seen.get(name, 0), x.numel() // max(1, x.shape[-1]))
        handles.append(layer.module.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return seen
