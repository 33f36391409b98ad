"""The pieces of :class:`~ampkit.lightning.AmpkitPrecision` that know Lightning's names and objects: the precision
name Lightning reports for a policy, the skip-aware LR scheduler, and the refusals' texts.

The plugin is :mod:`ampkit.lightning._precision`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._errors import PolicyError
from ..policy import Policy
from ..training import Engine

__all__ = ["StepsOnRealSteps", "default_device", "lightning_name", "sharded", "twin_with_scheduler"]


def lightning_name(policy: Policy) -> str:
    """The Lightning precision name nearest ``policy`` (what ``trainer.precision`` reports; the model summary sizes
    the weights by it).

    >>> from ampkit.policy import get_policy
    >>> lightning_name(get_policy("bf16-true-masters")), lightning_name(get_policy("16-mixed")), lightning_name(get_policy("tf32"))
    ('bf16-true', '16-mixed', '32-true')
    """
    if policy.param_dtype == torch.bfloat16:
        return "bf16-true"
    if policy.param_dtype == torch.float16:
        return "16-true"
    return {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}.get(policy.compute_dtype, "32-true")  # type: ignore[arg-type]


class StepsOnRealSteps:
    """An LR scheduler Lightning steps after each optimizer step (``interval="step"``) that steps only after a real
    one: a step skipped for overflow left the weights where they were, and so the schedule, as ampkit's Engine steps
    the schedulers it adopted. Everything else is the scheduler's own (state, ``optimizer``, ``get_last_lr``)."""

    def __init__(self, scheduler: Any, engine: Engine) -> None:
        self.scheduler = scheduler
        self._engine = engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self._engine.step_was_skipped:  # on a GPU with a fused optimizer, waits for the step's flag
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"StepsOnRealSteps({self.scheduler!r})"


def default_device() -> torch.device:
    """The device Fabric's "auto" accelerator takes: the process's GPU where there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are DTensor shards (FSDP2 applied in ``configure_model``): each rank's own."""
    return any(type(p).__name__ == "DTensor" for p in module.parameters())


def twin_with_scheduler(policy: Policy, optimizer: str) -> str:
    if policy.name not in ("bf16-true-kahan", "bf16-true-sr"):
        raise PolicyError(f"{policy.name}: an optimizer was replaced while a scheduler holds it")  # no other policy replaces one
    library = "optimi's AdamW(..., kahan_sum=True)" if policy.name == "bf16-true-kahan" else "torchao's _AdamW(..., bf16_stochastic_round=True)"
    return (
        f"{policy.name} steps a library twin of the {optimizer} that configure_optimizers() returned, but an LR scheduler was "
        f"built on the {optimizer}; build the library optimizer in configure_optimizers() ({library}, the twin ampkit would "
        "make) with its scheduler, and the plugin steps it as it is."
    )
