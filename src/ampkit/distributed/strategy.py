"""How the engine spreads a model over the ranks torchrun started: ``DDP`` (replicate) or ``FSDP`` (shard).

Pass one to the engine, or its name, and keep the training loop as it was::

    engine = Engine("bf16-mixed", accumulate=4, clip_grad_norm=1.0, strategy="ddp")   # or "fsdp", FSDP(...)
    model, optimizer = engine.setup(model, optimizer)    # wrapped/sharded; rank 0's weights on every rank

What changes under each, inside the engine:

* **DDP**: gradients are all-reduced during backward, so every rank holds the same gradients and reaches the
  same skip decision without any extra communication. Micro-batches that do not end an accumulation window
  run their forward under ``no_sync`` (through ``engine.autocast()``): one all-reduce per optimizer step.
* **FSDP** (FSDP2, ``fully_shard``): each rank holds a shard of every gradient, so a shard's inf is seen by one
  rank only; the found-inf flags are all-reduced (one tiny collective, no host sync) before the skip
  decision, and clipping uses the global norm over all shards. Gradients are reduce-scattered after every
  micro-batch by default, which keeps them sharded (``reduce_every_micro_batch=False`` trades that memory for
  one reduction per window).

A model the user wrapped already (``DistributedDataParallel(model)``, ``fully_shard(model)``) is recognised
and not wrapped again. Without a process group (``python train.py``), a strategy runs as a single process.

    >>> resolve_strategy("ddp"), resolve_strategy(None)
    (DDP(), None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..policy import Policy
from .ddp import wrap_ddp
from .fsdp import FSDPModule, shard_model

__all__ = ["Strategy", "DDP", "FSDP", "resolve_strategy", "detect_strategy", "unwrap"]


@dataclass(eq=False, repr=False)
class DDP:
    """Replicate the model on every rank and average gradients with ``DistributedDataParallel``.

    ``options`` go to ``DistributedDataParallel`` (``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``...); ``device_ids`` is filled in for CUDA.
    """

    options: dict[str, Any] = field(default_factory=dict)
    wrapped_by_user: bool = False

    name: ClassVar[str] = "ddp"
    grads_reduced: ClassVar[bool] = True
    """After backward every rank holds the same, all-reduced gradients."""

    @property
    def applied_by_user(self) -> bool:
        """The model arrived wrapped: setup() neither broadcasts nor wraps it again."""
        return self.wrapped_by_user

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        return wrap_ddp(model, device, **self.options)

    def __repr__(self) -> str:
        return f"DDP({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


@dataclass(eq=False)
class FSDP:
    """Shard parameters, gradients and optimizer state over the ranks with FSDP2 (``fully_shard``).

    Args:
        blocks: module names sharded as units of their own (default: the repeated blocks, e.g. transformer layers).
        reshard_after_forward: free each block's gathered parameters after its forward (gather again in backward).
        reduce_every_micro_batch: reduce-scatter gradients after every micro-batch (memory-lean); False reduces
            once per accumulation window and holds unsharded gradients meanwhile.
    """

    blocks: Sequence[str] | None = None
    reshard_after_forward: bool = True
    reduce_every_micro_batch: bool = True
    sharded_by_user: bool = False

    name: ClassVar[str] = "fsdp"
    grads_reduced: ClassVar[bool] = False
    """Each rank holds its shard of the gradients: a non-finite value shows on one rank only."""

    @property
    def applied_by_user(self) -> bool:
        """The model arrived sharded: setup() neither broadcasts nor shards it again."""
        return self.sharded_by_user

    def shard(self, model: nn.Module, policy: Policy, device: torch.device) -> list[str]:
        if self.sharded_by_user:
            return []
        return shard_model(model, policy, device, blocks=self.blocks, reshard_after_forward=self.reshard_after_forward)


Strategy = DDP | FSDP


def resolve_strategy(spec: Any) -> Strategy | None:
    """A strategy from ``"ddp"``, ``"fsdp"``, a :class:`DDP` / :class:`FSDP`, or None (no wrapping)."""
    if spec is None or isinstance(spec, (DDP, FSDP)):
        return spec
    if isinstance(spec, str) and spec.lower() in ("ddp", "fsdp", "fsdp2"):
        return DDP() if spec.lower() == "ddp" else FSDP()
    raise ValueError(f"strategy={spec!r} is not understood; pass 'ddp', 'fsdp', ampkit.distributed.DDP(...), FSDP(...) or None.")


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 shards in place: the module itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def detect_strategy(models: Sequence[nn.Module], requested: Strategy | None) -> Strategy | None:
    """The strategy for ``models``: ``requested``, or what a user-applied wrapper implies; mixing them raises."""
    ddp = [isinstance(m, DistributedDataParallel) for m in models]
    fsdp = [isinstance(m, FSDPModule) for m in models]
    if not any(ddp) and not any(fsdp):
        return requested
    kind = "ddp" if all(ddp) else "fsdp" if all(fsdp) else None
    if kind is None:
        raise ValueError("setup() got some models wrapped (DDP / fully_shard) and some not; pass them all unwrapped with Engine(strategy=...).")
    if requested is not None and requested.name != kind:
        raise ValueError(f"the model is already wrapped for {kind.upper()} but Engine(strategy={requested.name!r}); pass the unwrapped model or drop strategy.")
    if kind == "ddp":
        return DDP(options=requested.options if isinstance(requested, DDP) else {}, wrapped_by_user=True)
    base = requested if isinstance(requested, FSDP) else FSDP()
    return FSDP(base.blocks, base.reshard_after_forward, base.reduce_every_micro_batch, sharded_by_user=True)
