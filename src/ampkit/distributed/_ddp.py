"""Data parallelism with torch's DistributedDataParallel: replicate the model, all-reduce the gradients.

What the engine needs from DDP beyond wrapping: the same starting weights on every rank *before* a policy
clones fp32 masters or casts the model (DDP's own broadcast happens after, too late for the masters), and
``no_sync`` around the forward pass of micro-batches that do not end an accumulation window. DDP decides at
forward time whether the coming backward all-reduces, so the switch belongs to the forward context.

    >>> from torch import nn
    >>> ddp_models([nn.Linear(2, 2)])        # nothing wrapped here
    []
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["broadcast_from_rank0", "wrap_ddp", "ddp_models", "no_sync"]


def broadcast_from_rank0(models: Iterable[nn.Module]) -> None:
    """Give every rank rank 0's parameters and buffers (a no-op without a process group of more than one).

    Called once at setup; one broadcast per tensor is fine there (DDP's own start does the same in buckets).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for model in models:
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data if t.device.type != "meta" else t, src=0)


def wrap_ddp(model: nn.Module, device: torch.device, **options: Any) -> DistributedDataParallel:
    """``DistributedDataParallel(model)`` with ``device_ids`` right for ``device`` and ``options`` passed through."""
    if device.type == "cuda":
        options.setdefault("device_ids", [device.index if device.index is not None else torch.cuda.current_device()])
    return DistributedDataParallel(model, **options)


def ddp_models(models: Sequence[nn.Module]) -> list[DistributedDataParallel]:
    """The DDP wrappers among ``models``."""
    return [m for m in models if isinstance(m, DistributedDataParallel)]


def no_sync(models: Sequence[nn.Module]) -> contextlib.ExitStack:
    """DDP's ``no_sync`` on every wrapper in ``models``: backward passes of forwards run inside accumulate locally.

    >>> with no_sync([nn.Linear(2, 2)]):     # not wrapped: nothing to switch
    ...     pass
    """
    stack = contextlib.ExitStack()
    for m in ddp_models(models):
        stack.enter_context(m.no_sync())
    return stack
