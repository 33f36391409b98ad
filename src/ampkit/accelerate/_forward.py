"""The prepared model's forward runs in the engine's forward context, as Accelerate's own mixed precision does it.

An Accelerate loop (and the Hugging Face Trainer, which relies on Accelerate for autocast) writes no ``with
autocast():`` of its own: ``Accelerator.prepare_model`` replaces the module's ``forward`` by one that enters autocast
and returns fp32 outputs. :func:`run_forward_in` does the same with :meth:`ampkit.Engine.autocast` (the policy's
context, plus the engine's step hooks, such as the numerics sampler's), in the same layout: the original kept as
``model._original_forward`` and the wrappers chained through ``__wrapped__``, so ``accelerator.unwrap_model(model,
keep_fp32_wrapper=False)`` takes it off as it takes off Accelerate's. Outputs are turned to fp32 (Accelerate's
``convert_outputs_to_fp32``) where the policy autocasts an fp32 model, as Accelerate's bf16/fp16 does; a 16-bit model
(``bf16-true``...) returns its outputs as they are.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> engine = Engine("bf16-mixed"); model = engine.setup_module(nn.Linear(2, 2))
    >>> run_forward_in(model, engine)
    >>> model(torch.ones(1, 2)).dtype  # bf16 matmul inside, fp32 out
    torch.float32
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from ..training import Engine

__all__ = ["outputs_to_fp32", "run_forward_in"]


def outputs_to_fp32(engine: Engine) -> bool:
    """Whether the policy autocasts an fp32 model (its outputs are turned back to fp32, as Accelerate's are)."""
    policy = engine.policy
    return policy.param_dtype == torch.float32 and policy.compute_dtype not in (None, torch.float32)


def _in_context(engine: Engine, forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)  # sets __wrapped__: unwrap_model walks back to the original through it
    def in_engine_context(*args: Any, **kwargs: Any) -> Any:
        with engine.autocast():
            return forward(*args, **kwargs)

    return in_engine_context


def run_forward_in(model: nn.Module, engine: Engine) -> None:
    """Replace ``model.forward`` by one that runs in ``engine.autocast()`` (see the module docstring)."""
    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward  # type: ignore[method-assign]  # the attribute unwrap_model restores
    to_fp32 = outputs_to_fp32(engine)
    if not hasattr(model.forward, "__func__"):  # a forward set on the instance (a function, a partial of a hook)
        forward = _in_context(engine, model.forward)
        model.forward = convert_outputs_to_fp32(forward) if to_fp32 else forward  # type: ignore[method-assign]
        return
    forward = _in_context(engine, model.forward.__func__)
    model.forward = MethodType(convert_outputs_to_fp32(forward) if to_fp32 else forward, model)  # type: ignore[method-assign]
