"""The fp32 masters follow weights loaded into the model after setup.

Under a master-weight policy the model's 16-bit weights are copies of the fp32 masters the optimizer steps. A
``model.load_state_dict(...)`` after setup (``fabric.load``, ``accelerator.load_state``, a script's own resume) writes
the model only: the masters would keep the values they had, and the first step would write those, not the loaded
ones, back into the model. :class:`MastersFollowLoads`, a load-state-dict post-hook on each model, re-derives each
master whose 16-bit cast is no longer its weight from the loaded weight (the best that is left of it). A checkpoint
that also holds the masters (``engine.load``, ampkit's state in a framework's checkpoint) puts them back exactly
afterwards; one whose weights are the masters' own casts changes nothing.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> model = nn.Linear(2, 2); engine = Engine("bf16-true-masters")
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> _ = model.load_state_dict({"weight": torch.ones(2, 2), "bias": torch.zeros(2)})
    >>> engine.masters.masters[0]
    Parameter containing:
    tensor([[1., 1.],
            [1., 1.]], requires_grad=True)
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..policy._masters import MasterWeights

__all__ = ["MastersFollowLoads", "follow_loaded"]

log = logging.getLogger("ampkit")


class MastersFollowLoads:
    """A model's load-state-dict post-hook calling its owner's ``follow(module)`` (the engine's, held weakly: a deep
    copy of the model, which the tools make, carries the hook and must not keep the engine alive)."""

    def __init__(self, follow: Callable[[nn.Module], None] | None) -> None:
        self._follow = weakref.WeakMethod(follow) if follow is not None else None  # the engine passes a bound method

    def __call__(self, module: nn.Module, incompatible_keys: Any) -> None:
        follow = self._follow() if self._follow is not None else None
        if follow is not None:
            follow(module)

    def __deepcopy__(self, memo: dict[int, Any]) -> MastersFollowLoads:
        return self  # a copy of the model gets the same hook, which leaves any module but the engine's own alone

    def __reduce__(self) -> tuple[Any, ...]:
        return (MastersFollowLoads, (None,))  # a pickled model (torch.save(model)) keeps a hook that follows nothing


@torch.no_grad()
def follow_loaded(module: nn.Module, models: list[nn.Module], masters: MasterWeights | None, values: dict[int, torch.Tensor] | None) -> None:
    """After ``module.load_state_dict``: where ``module`` is one of ``models``, the ``masters`` (or the fp32 ``values``
    kept for masters still to come) take the loaded weights where their 16-bit casts are no longer those weights."""
    if not any(module is m for m in models):
        return  # a copy of the model
    changed = masters.follow_model() if masters is not None else _follow_values(values or {}, module)
    if changed:
        log.info("%d fp32 master weight(s) taken from the weights loaded into %s (their 16-bit values); a checkpoint holding "
                 "the masters puts them back exactly", changed, type(module).__name__)


def _follow_values(values: dict[int, torch.Tensor], module: nn.Module) -> int:
    """The fp32 values kept for masters still to come (``Engine.setup_module``) take the loaded weights' where those differ."""
    changed = 0
    for p in module.parameters():
        kept = values.get(id(p))
        if kept is not None and not torch.equal(kept.to(p.dtype), p):
            values[id(p)] = p.detach().to(torch.float32, copy=True)
            changed += 1
    return changed
