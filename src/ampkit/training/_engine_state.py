"""The engine's own state as a plain dict: counters, the loss scaler, master weights, pending gradients, and the
stochastic rounding's stream.

:meth:`Engine.state_dict <ampkit.training.Engine.state_dict>` returns :func:`engine_state`; a checkpoint
stores it beside the models and optimizers (:mod:`ampkit.checkpoint._payload`) and, once it has validated it,
puts it back with :func:`apply_engine_state`. It goes through the engine's public surface only: ``step_state``
(a :class:`~ampkit.training.StepState`), ``micro_batch_rows``, ``named_parameters()``, and the
optimizer step's own ``state_dict`` / ``load_state_dict`` (:class:`~ampkit.training.OptimizerStep`:
the scaler's, the masters' and the rounding stream's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike

__all__ = ["apply_engine_state", "engine_state", "pending_grads"]


def pending_grads(engine: EngineLike) -> dict[str, torch.Tensor] | None:
    """The gradients of an unfinished accumulation window by parameter name; None at a window boundary.

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> engine = Engine(accumulate=2)
    >>> model = nn.Linear(2, 1); model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> engine.backward(model(torch.ones(1, 2)).sum()); engine.step()
    False
    >>> sorted(pending_grads(engine))
    ['bias', 'weight']
    >>> engine.backward(model(torch.ones(1, 2)).sum()); engine.step(); pending_grads(engine) is None
    True
    True
    """
    if not engine.micro_batches_pending:
        return None
    return {name: p.grad.detach().clone() for name, p in engine.named_parameters() if p.grad is not None}


def engine_state(engine: EngineLike) -> dict[str, Any]:
    """The engine's own state (no model or optimizer tensors besides masters and pending gradients), one flat dict
    gathered from its owners: the loop's counters, the micro-batching's rows, the optimizer step's scaler, masters,
    skipped count and rounding stream. The keys are the ones checkpoints have always had."""
    state = {
        "policy": engine.policy.name,
        "accumulate": engine.accumulate,
        **engine.step_state.to_dict(),  # micro, epoch_len, steps
        "micro_batch_rows": engine.micro_batch_rows,
        **engine.optimizer_step.state_dict(),  # skipped_steps, scaler, masters, rounding
        "pending_grads": pending_grads(engine),
    }
    state["rounding"] = state.pop("rounding")  # last, where it was added (bf16-true-sr's stream)
    return state


def apply_engine_state(engine: EngineLike, state: dict[str, Any]) -> None:
    """Put back :func:`engine_state` through each owner (validated by the caller); forgets the last step's outcome."""
    engine.step_state.load_counters(state, state["skipped_steps"], engine.accumulate)  # that outcome was another process's last step
    if state.get("micro_batch_rows") is not None:  # learnt after an OOM; absent from older checkpoints
        engine.micro_batch_rows = state["micro_batch_rows"]
    engine.optimizer_step.load_state_dict(state)
    if state["pending_grads"] is not None:
        by_name = dict(engine.named_parameters())
        for name, grad in state["pending_grads"].items():
            p = by_name[name]
            p.grad = grad.to(device=p.device, dtype=p.dtype)
