"""The short training runs the doctor judges configurations by: a copy of the model trained a few steps under a
policy (every step's update audited, if asked), the held-out loss of its trained weights, and the noise of fp32's fall.

Every run starts from the same weights and trains on the same batches with the same dropout masks, so two runs differ
only by their arithmetic (:mod:`~ampkit.numerics._update_remedy`, :mod:`~ampkit.numerics._train_check`).

    >>> from torch import nn
    >>> torch.manual_seed(0); model = nn.Linear(4, 2)  # doctest: +ELLIPSIS
    <...>
    >>> batch = (torch.randn(8, 4), torch.randn(8, 2))
    >>> trained, _ = train_copy(model, [batch], nn.functional.mse_loss, lambda p: torch.optim.SGD(p, lr=0.1), "32-true", 3, 0)
    >>> held_out_loss(model, trained, batch, nn.functional.mse_loss, 0) < held_out_loss(model, None, batch, nn.functional.mse_loss, 0)
    True
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._util.model_io import batch_parts, call_model, output_as_float
from ._compare import LossFn, seeded
from ._update_audit import UpdateAudit, UpdateReport

if TYPE_CHECKING:
    from ..training._engine import Engine

__all__ = ["fall_noise", "held_out_loss", "train_copy"]


class _AuditEveryStep:
    """A step hook: the update audit of every optimizer step, read at once (the doctor is not a training loop)."""

    def __init__(self) -> None:
        self.audit, self.reports = UpdateAudit(), []  # type: ignore[var-annotated]

    def before_optimizer_step(self, engine: Engine) -> None:
        self.audit.arm(engine.optimizers, {id(p): n for n, p in engine.named_parameters()})

    def after_optimizer_step(self, engine: Engine) -> None:
        self.audit.disarm()
        stats = self.audit.stats()
        self.reports.append(self.audit.report(stats.flatten().tolist() if stats is not None else []))


def train_copy(
    model: nn.Module, batches: Sequence[Any], loss_fn: LossFn, optimizer: Callable[[Any], torch.optim.Optimizer],
    precision: str, steps: int, seed: int, *, audit: bool = False, stream: int | None = None, keep_fp32: Sequence[str] = (),
    init_scale: float | None = None,
) -> tuple[dict[str, torch.Tensor], list[UpdateReport]]:
    """``steps`` steps of a copy of ``model`` under ``precision``: its trained weights (the fp32 masters where it has
    them: they are the trajectory, the model holds them rounded) and the audit of each step. Step ``i``'s forward
    draws its dropout from ``seed + i``; the optimizer's draws come from ``stream`` (default ``seed``). A scaled
    policy's scaler starts at ``init_scale`` (default: the engine's)."""
    # The engine imports the policies; imported here to keep this module light.
    from ..training._engine import Engine

    hook = _AuditEveryStep() if audit else None
    work = copy.deepcopy(model).float()
    device = next((p.device for p in work.parameters()), torch.device("cpu"))
    from ..scaling import ScalerConfig

    hooks = [hook] if hook is not None else []
    if init_scale is not None:  # the scale the doctor settled on, its bounds widened to hold it
        scaler = ScalerConfig(init_scale=init_scale, min_scale=min(1.0, init_scale), max_scale=max(2.0**24, init_scale))
        engine = Engine(precision, keep_fp32=keep_fp32, hooks=hooks, scaler=scaler)
    else:
        engine = Engine(precision, keep_fp32=keep_fp32, hooks=hooks)
    work, _ = engine.setup(work, optimizer(work.parameters()))
    work.train()
    # The optimizer's own draws (stochastic rounding) come from a seeded stream too: the trial is repeatable, and
    # the caller's random stream is left as it was. Each forward gets its own seed: the same dropout masks in
    # every policy's trial.
    with seeded(seed if stream is None else stream, device):
        for i in range(steps):
            inputs, target = batch_parts(batches[i % len(batches)])
            with seeded(seed + i, device), engine.autocast():
                loss = loss_fn(output_as_float(call_model(work, inputs)), target)
            engine.backward(loss)
            engine.step()
    trained = {k: v.detach().float() for k, v in work.state_dict().items()}
    if engine.masters is not None:
        trained.update(engine.masters.state_dict())
    return trained, hook.reports if hook is not None else []


def fall_noise(model: nn.Module, trained: dict[str, torch.Tensor], batch: Any, loss_fn: LossFn, seed: int) -> float | None:
    """The standard error of the held-out fall from ``model``'s weights to ``trained``: ``|d_A - d_B| / 2``, each half
    of the batch's fall measured on its own (the same dropout mask before and after). None when the batch cannot be
    halved."""
    from ..training._micro_batching import batch_rows, split_batch

    try:
        rows = batch_rows(batch)
    except ValueError:
        return None
    if rows < 2:
        return None
    falls = []
    for half in (split_batch(batch, 0, rows // 2), split_batch(batch, rows // 2, rows)):
        falls.append(held_out_loss(model, None, half, loss_fn, seed) - held_out_loss(model, trained, half, loss_fn, seed))
    return abs(falls[0] - falls[1]) / 2


@torch.no_grad()
def held_out_loss(model: nn.Module, weights: dict[str, torch.Tensor] | None, batch: Any, loss_fn: LossFn, seed: int) -> float:
    """The fp32 loss of ``model`` with ``weights`` (None: its own) on ``batch``, in training mode with the dropout
    mask ``seed`` draws."""
    work = copy.deepcopy(model).float().train()
    if weights is not None:
        work.load_state_dict(weights)
    device = next((p.device for p in work.parameters()), torch.device("cpu"))
    inputs, target = batch_parts(batch)
    with seeded(seed, device):
        return float(loss_fn(output_as_float(call_model(work, inputs)), target))
