"""What ``Engine.setup()`` does to the models: the strategy's wrapping or sharding, master weights, the policy's casts.

The strategy decides the order (a DDP or FSDP run broadcasts rank 0's weights first; FSDP's mixed precision
carries the policy itself, so nothing is cast here); the engine's share, the policy's masters
(:meth:`~ampkit.policy.Policy.build_masters`) and its casts, is handed to it as ``cast``.

    >>> from torch import nn
    >>> from ampkit.policy import get_policy
    >>> model = nn.Linear(2, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> prepared = prepare_models([model], [opt], get_policy("O2"), None)
    >>> model.weight.dtype, prepared.masters.masters[0].dtype, [n for n, _ in prepared.named]
    (torch.float16, torch.float32, ['weight', 'bias'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..distributed._strategy import SingleProcess, Strategy, choose_strategy, unwrap
from ..policy import Policy
from ..policy._masters import MasterWeights
from ._engine_args import check_optimizer_params

__all__ = ["Prepared", "prepare_models"]


@dataclass
class Prepared:
    """The models as setup() leaves them, and what the engine keeps of the preparation."""

    strategy: Strategy | None
    """The strategy that runs (None for a single process)."""
    parallel: Strategy | SingleProcess
    """The same, or the do-nothing strategy."""
    models: list[nn.Module]
    """The modules themselves (inside any DDP wrapper)."""
    wrappers: list[nn.Module]
    """What the training loop calls: DDP wrappers, or the models."""
    device: torch.device
    masters: MasterWeights | None
    named: list[tuple[str, nn.Parameter]]
    """Every parameter by the name checkpoints use, once sharding has replaced what it replaces."""
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    """The fp32 values the masters of optimizers built after the cast are cloned from (``keep_values``)."""


def prepare_models(
    given: list[nn.Module], optimizers: Sequence[torch.optim.Optimizer], policy: Policy, requested: Strategy | None, *,
    keep_values: bool = False, device: torch.device | None = None,
) -> Prepared:
    """Spread, wrap and cast ``given`` for ``policy``; point ``optimizers`` at master weights or shards.

    ``keep_values``: the optimizers come later (``Engine.setup_module``): keep the fp32 values their masters are cloned
    from. ``device``: the device the models will train on when they are not there yet (a framework moves them after);
    the casts are made for it, and the policy is checked against it once the optimizers are set up.
    """
    strategy = choose_strategy(given, requested, policy)
    parallel = strategy if strategy is not None else SingleProcess()
    models = [unwrap(m) for m in given]
    if device is None:
        first = next((p for m in models for p in m.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        policy.check_device(device)

    def names() -> list[tuple[str, nn.Parameter]]:
        return [(f"{i}.{n}" if len(models) > 1 else n, p) for i, m in enumerate(models) for n, p in m.named_parameters(remove_duplicate=True)]

    check_optimizer_params(optimizers, {id(p) for _, p in names()})
    masters: list[MasterWeights] = []
    values: dict[int, torch.Tensor] = {}

    def cast(targets: list[nn.Module]) -> None:  # the policy, applied when the strategy says
        if keep_values:
            values.update(policy.master_values(targets))  # the optimizers' masters are cloned from these later
        else:
            built = policy.build_masters(targets, names(), optimizers)  # before the cast: the fp32 values are cloned
            if built is not None:
                masters.append(built)
        for m in targets:
            policy.convert_module(m, device.type)

    wrappers = parallel.setup(given, models, policy, device, optimizers, cast, names)
    return Prepared(strategy, parallel, models, wrappers, device, masters[0] if masters else None, names(), values)
