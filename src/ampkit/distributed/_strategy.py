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
and not wrapped again. Without a process group (``python train.py``), a strategy runs as a single process:
:class:`SingleProcess`, which does nothing.

Each strategy owns what differs across ranks, so the engine never asks which one it holds:

* ``setup(given, models, policy, device, optimizers, cast, named)``: broadcast, then wrap or shard the models;
  ``cast`` is the engine's own preparation (master weights, casting the model), which a strategy that carries
  the precision itself (FSDP's mixed precision) does not call. Returns what the training loop calls.
* ``forward_context(wrappers, boundary)``: the context a micro-batch's forward runs in (DDP's ``no_sync`` off
  the window boundary), or None.
* ``before_backward(models, boundary)``: FSDP's choice of reducing gradients at this micro-batch.
* ``grads_reduced``: whether every rank holds the same gradients after backward (so no flag needs combining).

    >>> resolve_strategy("ddp"), resolve_strategy(None)
    (DDP(), None)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .._compat import fsdp_problem
from ..policy import Policy
from ._ddp import broadcast_from_rank0, no_sync, wrap_ddp
from ._environment import launched_by_torchrun
from ._fsdp import FSDPModule, adopt_sharded_params, set_gradient_sync, shard_model

__all__ = ["DDP", "FSDP", "SingleProcess", "Strategy", "choose_strategy", "detect_strategy", "resolve_strategy", "unwrap"]

log = logging.getLogger("ampkit")

Cast = Callable[[list[nn.Module]], None]
"""The engine's own preparation of the models (master weights, casting), called by a strategy that wants it."""
Named = Callable[[], list[tuple[str, nn.Parameter]]]
"""The models' named parameters as they are now (a shard replaces them)."""


@dataclass(eq=False, repr=False)
class SingleProcess:
    """One process, nothing to spread: the models train as they are (the engine's default).

    >>> SingleProcess().setup([], [], None, torch.device("cpu"), [], lambda models: None, list)
    []
    """

    name: ClassVar[str] = "single"
    has_forward_context: ClassVar[bool] = False
    """Whether :meth:`forward_context` can return a context; the engine skips the call (and working out the
    window boundary it takes) where it cannot, keeping the forward's overhead at one attribute read."""
    grads_reduced: ClassVar[bool] = False
    """Without a strategy the engine cannot know that other ranks (if any) hold the same gradients."""
    applied_by_user: ClassVar[bool] = False

    def setup(self, given: list[nn.Module], models: list[nn.Module], policy: Policy, device: torch.device,
              optimizers: Sequence[torch.optim.Optimizer], cast: Cast, named: Named) -> list[nn.Module]:
        cast(models)
        return models

    def forward_context(self, wrappers: Sequence[nn.Module], boundary: bool) -> AbstractContextManager[Any] | None:
        return None

    def before_backward(self, models: Sequence[nn.Module], boundary: bool) -> None:
        return None

    def __repr__(self) -> str:
        return "SingleProcess()"


@dataclass(eq=False, repr=False)
class DDP:
    """Replicate the model on every rank and average gradients with ``DistributedDataParallel``.

    ``options`` go to ``DistributedDataParallel`` (``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``...); ``device_ids`` is filled in for CUDA.
    """

    options: dict[str, Any] = field(default_factory=dict)
    wrapped_by_user: bool = False

    name: ClassVar[str] = "ddp"
    has_forward_context: ClassVar[bool] = True  # no_sync off the boundary
    grads_reduced: ClassVar[bool] = True
    """After backward every rank holds the same, all-reduced gradients."""

    @property
    def applied_by_user(self) -> bool:
        """The model arrived wrapped: setup() neither broadcasts nor wraps it again."""
        return self.wrapped_by_user

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        return wrap_ddp(model, device, **self.options)

    def setup(self, given: list[nn.Module], models: list[nn.Module], policy: Policy, device: torch.device,
              optimizers: Sequence[torch.optim.Optimizer], cast: Cast, named: Named) -> list[nn.Module]:
        if self.wrapped_by_user:
            cast(models)
            return list(given)
        broadcast_from_rank0(models)  # before masters are cloned or the model cast: every rank starts alike
        cast(models)
        return [self.wrap(m, device) for m in models]

    def forward_context(self, wrappers: Sequence[nn.Module], boundary: bool) -> AbstractContextManager[Any] | None:
        # DDP decides during the forward whether the coming backward all-reduces: off the boundary, it must not.
        return None if boundary else no_sync(wrappers)

    def before_backward(self, models: Sequence[nn.Module], boundary: bool) -> None:
        return None

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
    has_forward_context: ClassVar[bool] = False
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

    def setup(self, given: list[nn.Module], models: list[nn.Module], policy: Policy, device: torch.device,
              optimizers: Sequence[torch.optim.Optimizer], cast: Cast, named: Named) -> list[nn.Module]:
        # FSDP's mixed precision carries the policy (its fp32 shards are the masters): ``cast`` is not called.
        # Sharding replaces every parameter by its shard; the optimizers are pointed at the shards.
        problem = fsdp_problem(device.type, dist.get_world_size())
        if problem is not None:
            raise RuntimeError(problem)
        if not self.sharded_by_user:
            broadcast_from_rank0(models)
        before = {id(p): n for n, p in named()}
        for m in models:
            self.shard(m, policy, device)
        adopt_sharded_params(optimizers, before, dict(named()))
        return models

    def forward_context(self, wrappers: Sequence[nn.Module], boundary: bool) -> AbstractContextManager[Any] | None:
        return None

    def before_backward(self, models: Sequence[nn.Module], boundary: bool) -> None:
        if not self.reduce_every_micro_batch:
            set_gradient_sync(models, boundary)


Strategy = DDP | FSDP


def choose_strategy(models: Sequence[nn.Module], requested: Strategy | None, policy: Policy) -> Strategy | None:
    """The strategy setup() applies: ``requested``, or what pre-wrapped models imply; None without a process group.

    >>> from ampkit.policy import get_policy
    >>> choose_strategy([nn.Linear(2, 2)], None, get_policy("bf16-mixed")) is None  # no DDP/FSDP asked for or found
    True
    """
    import torch.distributed as dist

    strategy = detect_strategy(models, requested)
    if strategy is None:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        if launched_by_torchrun():
            raise RuntimeError(
                f"Engine(strategy={strategy.name!r}) under torchrun needs the process group first: call "
                "ampkit.distributed.init_distributed() before engine.setup()."
            )
        log.info("no process group (not launched by torchrun): strategy %r runs as a single process", strategy.name)
        return None
    if strategy.applied_by_user and policy.casts_parameters():
        raise ValueError(
            f"the model was wrapped for {strategy.name.upper()} before setup(), but policy {policy.name!r} casts "
            f"its parameters, which the wrapper has already registered: pass the plain model and "
            f"Engine(precision={policy.name!r}, strategy={strategy.name!r})."
        )
    return strategy


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
