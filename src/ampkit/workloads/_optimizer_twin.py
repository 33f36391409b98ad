"""An optimizer rebuilt on another copy of its model: what every policy's run (a tune's trial, a LightningModule's
copy) steps in place of the user's own, which is never stepped.

    >>> from torch import nn
    >>> m = nn.Linear(2, 2)
    >>> opt = torch.optim.SGD([{"params": [m.weight], "lr": 0.5}, {"params": [m.bias]}], lr=0.1, momentum=0.9)
    >>> twin = optimizer_twin(opt, m, "not m's")(nn.Linear(2, 2).parameters())  # a copy's parameters, in the model's order
    >>> [(g["lr"], g["momentum"]) for g in twin.param_groups]
    [(0.5, 0.9), (0.1, 0.9)]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["optimizer_twin"]


def optimizer_twin(optimizer: torch.optim.Optimizer, model: nn.Module, refusal: str) -> Callable[[Any], torch.optim.Optimizer]:
    """``params -> optimizer`` of ``optimizer``'s class, groups and settings over a copy's parameters (``params`` in
    ``model.parameters()``'s order); its state is not copied, so each run starts as a fresh one does. A group's
    learning rate is the one it was configured with (``initial_lr``, where a scheduler built on it set the group's
    ``lr`` already, a warm-up from 0). ``refusal``: the ValueError's message when the optimizer holds parameters that
    are not ``model``'s."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    if any(id(p) not in position for g in optimizer.param_groups for p in g["params"]):
        raise ValueError(refusal)
    groups = [
        ([position[id(p)] for p in g["params"]], {**{k: v for k, v in g.items() if k not in ("params", "initial_lr")}, "lr": g.get("initial_lr", g["lr"])})
        for g in optimizer.param_groups
    ]
    cls = type(optimizer)
    # Every group carries its settings; the defaults fill what the constructor requires, filtered to what it accepts
    # (AdamW inherits defaults its own __init__ does not take).
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}

    def build(params: Any) -> torch.optim.Optimizer:
        copied = list(params)
        return cls([{**settings, "params": [copied[i] for i in indices]} for indices, settings in groups], **defaults)

    return build
