"""O2/O3's model conversion: 16-bit weights, BatchNorm optionally fp32, inputs and outputs cast at the edge.

Apex replaced the model's ``forward`` to cast inputs and outputs; forward hooks do the same here and survive
``copy.deepcopy``. BatchNorm layers kept in fp32 become fp32 islands (fp32 in, fp32 statistics, 16-bit out).
Every ``_BatchNorm`` is kept, affine or not: Apex converted non-affine ones, storing running statistics in
fp16, which loses them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ..policy._islands import cast_floating, make_fp32_island

__all__ = ["modules_to_convert", "convert_model", "cast_io"]

_IO_MARK = "_ampkit_apex_io"


def modules_to_convert(model: nn.Module, keep_batchnorm_fp32: bool) -> tuple[list[nn.Module], list[nn.Module]]:
    """``(converted, kept_fp32)``: the modules whose own tensors go 16-bit, and the BatchNorms that stay fp32."""
    kept = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] if keep_batchnorm_fp32 else []
    inside = {id(sub) for bn in kept for sub in bn.modules()}
    return [m for m in model.modules() if id(m) not in inside], kept


def convert_model(model: nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool, device_type: str) -> None:
    """Cast ``model``'s floating parameters and buffers to ``dtype`` in place, BatchNorms aside if asked.

    Parameter objects are kept (their ``.data`` is replaced), so optimizers built on them stay valid.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)); convert_model(m, torch.bfloat16, True, "cpu")
    >>> m[0].weight.dtype, m[1].weight.dtype
    (torch.bfloat16, torch.float32)
    """
    converted, kept = modules_to_convert(model, keep_batchnorm_fp32)
    for m in converted:
        for tensors in (m._parameters, m._buffers):
            for t in tensors.values():
                if t is not None and t.is_floating_point() and t.dtype != dtype:
                    t.data = t.data.to(dtype)
    if dtype != torch.float32:
        for bn in kept:
            make_fp32_island(bn, device_type, output_dtype=dtype)


def _cast_inputs(dtype: torch.dtype, module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
    return cast_floating(args, dtype), cast_floating(kwargs, dtype)


def _cast_outputs(dtype: torch.dtype, module: nn.Module, args: Any, output: Any) -> Any:
    return cast_floating(output, dtype)


def cast_io(model: nn.Module, input_dtype: torch.dtype | None, output_dtype: torch.dtype | None) -> None:
    """Cast ``model``'s floating inputs to ``input_dtype`` and outputs to ``output_dtype`` (None: leave them).

    >>> m = nn.Identity(); cast_io(m, torch.bfloat16, torch.float64)
    >>> m(torch.ones(1)).dtype
    torch.float64
    """
    if input_dtype is not None:
        model.register_forward_pre_hook(functools.partial(_cast_inputs, input_dtype), with_kwargs=True)
    if output_dtype is not None:
        model.register_forward_hook(functools.partial(_cast_outputs, output_dtype))
    setattr(model, _IO_MARK, True)


def has_amp_io(model: nn.Module) -> bool:
    """True when :func:`cast_io` was applied to ``model`` (it went through amp.initialize)."""
    return bool(getattr(model, _IO_MARK, False))
