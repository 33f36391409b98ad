"""What a :class:`~ampkit.memory.MemoryTracker` watches: the tensors that modules, optimizers, an Engine
or containers of them hold, counted in the CPU's live total from the start of tracking."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__: list[str] = []  # private helpers of ampkit.memory._tracker


def _tensors_of(obj: Any, out: list[torch.Tensor]) -> None:
    """The tensors ``obj`` holds: a module's parameters, gradients and buffers, an optimizer's parameters and
    state, an Engine's models, optimizers, master weights and scaler state, or tensors in containers."""
    from ..training._engine import Engine  # here: the engine module imports much of ampkit

    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.grad is not None:
            out.append(obj.grad)
    elif isinstance(obj, nn.Module):
        for t in [*obj.parameters(), *obj.buffers()]:
            _tensors_of(t, out)
    elif isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            _tensors_of(group["params"], out)
        for state in obj.state.values():
            _tensors_of(list(state.values()), out)
    elif isinstance(obj, Engine):
        _tensors_of([*obj.models, *obj.optimizers], out)
        if obj.masters is not None:
            _tensors_of(obj.masters.tensors(), out)
        for holder in (obj, obj.scaler):
            if holder is not None:
                _tensors_of([v for v in vars(holder).values() if isinstance(v, torch.Tensor)], out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _tensors_of(v, out)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _tensors_of(v, out)
    else:
        raise TypeError(
            f"watch= takes modules, optimizers, an ampkit Engine, tensors, or lists/dicts of them; got {type(obj).__name__}."
        )


def _device_of(objs: Sequence[Any]) -> torch.device | None:
    tensors: list[torch.Tensor] = []
    for obj in objs:
        _tensors_of(obj, tensors)
    return next((t.device for t in tensors if t.device.type != "meta"), None)
