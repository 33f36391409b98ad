"""Whether a configuration *trains*: a few optimizer steps from the initial weights against fp32's, on a held-out batch.

One step under a policy says whether its gradients agree with fp32's; a short run says whether that matters. The
:class:`TrainingJudge` trains ``32-true`` once (the control) and then any configuration on its request, from the
same weights, on the same batches with the same dropout masks (:func:`~ampkit.numerics._update_remedy.train_copy`),
and judges it on a held-out batch in fp32: the configuration *trains* when its held-out loss falls by at least
:data:`~ampkit.numerics._update_remedy.RECOVERED_SHARE` of fp32's fall. As in the update-precision check, that
judges only where fp32's own fall exceeds its noise (:attr:`TrainingJudge.judged`).

The doctor uses it to make sure the configuration it pastes trains: a policy whose tailored step still diverges
from fp32 is trained before it is pasted, and the fallback it pastes instead is trained too
(:mod:`~ampkit.numerics._paste`).

    >>> from torch import nn
    >>> torch.manual_seed(0); model = nn.Linear(4, 2)  # doctest: +ELLIPSIS
    <...>
    >>> g = torch.Generator().manual_seed(0); w = torch.randn(4, 2, generator=g)
    >>> data = [(x, x @ w) for x in (torch.randn(32, 4, generator=g) for _ in range(3))]
    >>> judge = TrainingJudge(model, data[:2], data[2], nn.functional.mse_loss, lambda p: torch.optim.SGD(p, lr=0.1), steps=4)
    >>> judge.judged, judge.trial("bf16-mixed").trains
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._compare import LossFn
from ._update_remedy import NOISE_FACTOR, RECOVERED_SHARE, fall_noise, held_out_loss, train_copy

__all__ = ["TrainTrial", "TrainingJudge"]


@dataclass(frozen=True)
class TrainTrial:
    """One configuration trained for the judge's steps: its held-out loss, against fp32's, and whether it trains."""

    precision: str
    keep_fp32: list[str]
    loss_scale: float | None
    loss: float
    fp32_loss: float
    initial_loss: float
    trains: bool
    """Its held-out loss fell by at least RECOVERED_SHARE of fp32's fall (and fp32's fall was judged)."""
    steps: int

    def describe(self) -> str:
        """``held-out loss 1.38 against fp32's 0.54 after 8 steps (from 1.52)``."""
        return f"held-out loss {self.loss:.4g} against fp32's {self.fp32_loss:.4g} after {self.steps} steps (from {self.initial_loss:.4g})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision, "keep_fp32": list(self.keep_fp32), "loss_scale": self.loss_scale, "loss": self.loss,
            "fp32_loss": self.fp32_loss, "initial_loss": self.initial_loss, "trains": self.trains, "steps": self.steps,
        }


@dataclass
class TrainingJudge:
    """fp32's run of ``steps`` steps from ``model``'s weights (the control), and :meth:`trial` for any configuration."""

    model: nn.Module
    batches: Sequence[Any]
    held_out: Any
    loss_fn: LossFn
    optimizer: Callable[[Any], torch.optim.Optimizer]
    steps: int
    seed: int = 0
    initial_loss: float = field(init=False)
    fp32_loss: float = field(init=False)
    noise: float | None = field(init=False)
    judged: bool = field(init=False)
    """fp32's held-out loss fell by more than its noise: a configuration can be judged by whether it follows."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"TrainingJudge(steps={self.steps}): steps must be >= 1 (optimizer steps per configuration).")
        self.initial_loss = held_out_loss(self.model, None, self.held_out, self.loss_fn, self.seed)
        fp32 = train_copy(self.model, self.batches, self.loss_fn, self.optimizer, "32-true", self.steps, self.seed)[0]
        self.fp32_loss = held_out_loss(self.model, fp32, self.held_out, self.loss_fn, self.seed)
        self.noise = fall_noise(self.model, fp32, self.held_out, self.loss_fn, self.seed)
        self.judged = self.initial_loss - self.fp32_loss > NOISE_FACTOR * (self.noise or 0.0)

    def trial(self, precision: str, keep_fp32: Sequence[str] = (), loss_scale: float | None = None) -> TrainTrial:
        """Train ``precision`` (with ``keep_fp32`` and, for a scaled policy, a scaler starting at ``loss_scale``) for the
        judge's steps and judge it against fp32's fall."""
        trained = train_copy(
            self.model, self.batches, self.loss_fn, self.optimizer, precision, self.steps, self.seed, keep_fp32=keep_fp32, init_scale=loss_scale,
        )[0]
        loss = held_out_loss(self.model, trained, self.held_out, self.loss_fn, self.seed)
        trains = self.judged and self.initial_loss - loss >= RECOVERED_SHARE * (self.initial_loss - self.fp32_loss)
        return TrainTrial(precision, list(keep_fp32), loss_scale, loss, self.fp32_loss, self.initial_loss, bool(trains), self.steps)
