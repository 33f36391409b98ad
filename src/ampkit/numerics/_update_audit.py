"""How much of an optimizer step survives in 16-bit weights: the update the optimizer meant against the one applied.

A policy without fp32 masters (``bf16-true``, ``16-true``) lets the optimizer step the 16-bit weights
themselves. bf16 keeps 8 significant bits, so an update smaller than half the gap to the next bf16 value
rounds to nothing; decoupled weight decay ``lr * wd * |w|`` (1e-5 relative at lr 1e-3, wd 0.01) is far below
that gap (2^-9, about 2e-3 relative) and never lands. :class:`UpdateAudit` measures it on one step, for any torch
optimizer, through the optimizer's own step hooks:

* before the step (``register_step_pre_hook``), a *shadow* step: a throwaway optimizer of the same class, with the
  same param-group hyperparameters, steps fp32 clones of the 16-bit parameters, of their gradients (as the
  optimizer sees them: unscaled, clipped) and of their state. ``intended = p32_after - p_before``;
* after it (``register_step_post_hook``), ``applied = p_after - p_before`` in fp32.

Per parameter it keeps, on the device, the figures of :class:`ParamUpdate`; :meth:`UpdateAudit.stats` stacks
them into one tensor for the caller's single device-to-host read. Parameters the optimizer steps in fp32 (master
weights) lose nothing and are not audited.

    >>> p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    >>> opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01)
    >>> audit = UpdateAudit()
    >>> audit.arm([opt], {id(p): "w"})
    True
    >>> p.grad = torch.ones_like(p); opt.step(); audit.disarm()
    >>> report = audit.report(audit.stats().flatten().tolist())
    >>> report.lost_share, report.decay_lost_share, [u.name for u in report.worst]
    (1.0, 1.0, ['w'])
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._util.units import fmt_share

__all__ = [
    "UpdateAudit", "ParamUpdate", "UpdateReport", "REMEDIES", "UPDATE_LOST_WARN", "UPDATE_DISCARDED_WARN", "DECAY_LOST_WARN",
    "PARAM_FROZEN_WARN",
]

UPDATE_LOST_WARN = 0.25
"""Share of the elements the optimizer meant to move that did not move at all, above which a sample warns. Where
the update follows the gradient (SGD), the elements with the smallest gradients always lose some of theirs (10% at
a moderate lr is common and harmless); a quarter of the moving elements frozen is the bulk of the model, not the
tail. Adam-like updates are all about lr in size, so there the share is near 0 or near 1."""
UPDATE_DISCARDED_WARN = 0.25
"""Share of the update's norm rounding discards (``||applied - intended|| / ||intended||``) above which a sample
warns: beyond a quarter the weights follow a different trajectory from the one the optimizer computed."""
PARAM_FROZEN_WARN = 0.9
"""Share of one parameter's moving elements that keep their old value above which that parameter alone warns,
whatever share of the model it is: it is frozen in practice (a normalisation gain at 1.0 under Adam, where bf16's
gap is 2^-7 and every update is about lr)."""
DECAY_LOST_WARN = 0.5
"""Share of decayed weights on which the decay step alone is below half a gap of the weight's dtype, above which a
sample warns: most of the model is then not decayed at all."""

REMEDIES: tuple[tuple[str, float], ...] = (
    ("bf16-true-sr", 0),
    ("bf16-true-kahan", 2),
    ("bf16-true-remainder", 2.125),
    ("bf16-true-masters", 8),
)
"""Policies that keep small updates, cheapest first, with the bytes per parameter each adds beside the bf16 model:
stochastic rounding (none), a Kahan compensation buffer (2), an int16 remainder and a tie bit between steps (2.125), an fp32 master
and fp32 gradient (8)."""

# Columns of a parameter's row in the stacked statistics.
_COUNT, _ERR2, _INT2, _MOVING, _LOST, _DECAYED, _DECAY_LOST, _SKIPPED, _NONFINITE = range(9)
_COLUMNS = 9


@dataclass(frozen=True)
class ParamUpdate:
    """One parameter's update on an audited step (figures counted over its elements)."""

    name: str
    count: int
    """Elements of the parameter."""
    moving: int
    """Elements the fp32 shadow step moved (intended update non-zero)."""
    lost: int
    """Of those, elements the real step did not move at all."""
    discarded: float
    """``||applied - intended|| / ||intended||``: the share of the update rounding discarded (0 when none was meant)."""
    decayed: int = 0
    """Non-zero elements in a param group with weight decay."""
    nonfinite: int = 0
    """Elements the 16-bit step made inf or NaN (a 16-bit optimizer state that overflowed, or an eps that flushed
    to zero); the other figures count the finite ones."""
    decay_lost: int = 0
    """Of those, elements where the decay step ``lr * wd * |w|`` is below half the gap to the next smaller value of
    the parameter's dtype, so decay alone never moves them."""

    @property
    def lost_share(self) -> float:
        return self.lost / self.moving if self.moving else 0.0

    @property
    def decay_lost_share(self) -> float | None:
        return self.decay_lost / self.decayed if self.decayed else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "count": self.count, "lost_share": self.lost_share, "discarded_share": self.discarded,
            "decay_lost_share": self.decay_lost_share, "nonfinite": self.nonfinite,
        }

    def __str__(self) -> str:
        decay = f", decay {fmt_share(self.decay_lost_share)} lost" if self.decay_lost_share is not None else ""
        broken = f", {self.nonfinite} non-finite" if self.nonfinite else ""
        return f"{self.name or '(model)'} ({fmt_share(self.lost_share)} lost, {fmt_share(self.discarded)} discarded{decay}{broken})"


@dataclass
class UpdateReport:
    """The audit of one step: every 16-bit parameter stepped directly, and the worst of them."""

    params: dict[str, ParamUpdate] = field(default_factory=dict)
    worst: list[ParamUpdate] = field(default_factory=list)
    """Up to ``top`` parameters that lost most of their update, worst first (non-finite elements, lost share, then
    discarded share)."""
    discarded_share: float = 0.0
    """Over all audited parameters: ``sqrt(sum ||applied - intended||^2 / sum ||intended||^2)``."""

    @property
    def lost_share(self) -> float:
        """Share of all moving elements that did not move."""
        moving = sum(u.moving for u in self.params.values())
        return sum(u.lost for u in self.params.values()) / moving if moving else 0.0

    @property
    def decay_lost_share(self) -> float | None:
        """Share of all decayed elements decay never moves; None without weight decay."""
        decayed = sum(u.decayed for u in self.params.values())
        return sum(u.decay_lost for u in self.params.values()) / decayed if decayed else None

    @classmethod
    def merge(cls, reports: Sequence[UpdateReport], top: int = 3) -> UpdateReport:
        """Several steps' audits as one: counts added up, discarded shares averaged over the steps.

        >>> one = UpdateReport({"w": ParamUpdate("w", count=4, moving=4, lost=4, discarded=1.0)}, discarded_share=1.0)
        >>> two = UpdateReport({"w": ParamUpdate("w", count=4, moving=4, lost=0, discarded=0.0)}, discarded_share=0.0)
        >>> merged = UpdateReport.merge([one, two]); merged.lost_share, merged.discarded_share
        (0.5, 0.5)
        """
        params: dict[str, ParamUpdate] = {}
        for name in dict.fromkeys(n for r in reports for n in r.params):
            seen = [r.params[name] for r in reports if name in r.params]
            params[name] = ParamUpdate(
                name=name, count=seen[0].count, moving=sum(u.moving for u in seen), lost=sum(u.lost for u in seen),
                discarded=sum(u.discarded for u in seen) / len(seen), decayed=sum(u.decayed for u in seen),
                decay_lost=sum(u.decay_lost for u in seen), nonfinite=sum(u.nonfinite for u in seen),
            )
        shares = [r.discarded_share for r in reports if r.params]
        return cls(params=params, worst=_worst(params, top), discarded_share=sum(shares) / len(shares) if shares else 0.0)

    def figures(self) -> dict[str, float | None]:
        """The figures :meth:`NumericsSample.to_scalars` exports (None: does not apply)."""
        if not self.params:
            return {}
        return {"update_lost_share": self.lost_share, "update_discarded_share": self.discarded_share, "decay_lost_share": self.decay_lost_share}

    def problems(self) -> list[str]:
        """What is lost beyond the warning thresholds, naming the worst parameters and the remedy policies."""
        decay = self.decay_lost_share
        lost = [
            f"{fmt_share(share)} {what}" for share, what, limit in (
                (self.lost_share, "of the elements the optimizer moves keep their old value", UPDATE_LOST_WARN),
                (self.discarded_share, "of the update's norm is rounded away", UPDATE_DISCARDED_WARN),
                (decay or 0.0, "of the decayed weights never decay (lr * wd * |w| is below half a 16-bit gap)", DECAY_LOST_WARN),
            ) if share > limit
        ]
        frozen = [u.name for u in self.params.values() if u.moving and u.lost_share >= PARAM_FROZEN_WARN]
        if frozen:
            shown = ", ".join(frozen[:5]) + (f" and {len(frozen) - 5} more" if len(frozen) > 5 else "")
            lost.append(f"{len(frozen)} parameters ({shown}) lose {fmt_share(PARAM_FROZEN_WARN)} or more of their updates: they do not train")
        broken = sum(u.nonfinite for u in self.params.values())
        out = [f"the 16-bit optimizer step made {broken} weights non-finite: step fp32 masters (a -masters policy)"] if broken else []
        if not lost:
            return out
        where = f" (worst: {', '.join(str(u) for u in self.worst)})" if self.worst else ""
        remedies = ", ".join(f"{name} (+{nbytes} B/param)" for name, nbytes in REMEDIES)
        return out + [
            (
                f"updates lost in 16-bit weights: {'; '.join(lost)}{where}: step masters or compensate the rounding with one of "
                f"{remedies}, or `ampkit doctor` to find the cheapest that recovers fp32's training"
            )
        ]

    def __str__(self) -> str:
        if not self.params:
            return "updates not audited (no 16-bit weights stepped)"
        decay = self.decay_lost_share
        return (
            f"updates {fmt_share(self.lost_share)} lost, {fmt_share(self.discarded_share)} discarded"
            + (f", decay {fmt_share(decay)} lost" if decay is not None else "")
        )


class UpdateAudit:
    """Audits the next ``step()`` of the optimizers it is armed on: :meth:`arm`, step, :meth:`disarm`, then
    read :meth:`stats` (a device tensor) with everything else and turn the values into a :meth:`report`."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._names: dict[int, str] = {}
        self._shadows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(p): (p before, p32 after the shadow step)
        self._rows: list[tuple[str, torch.Tensor]] = []

    def arm(self, optimizers: Sequence[torch.optim.Optimizer], names: Mapping[int, str]) -> bool:
        """Hook the optimizers that step 16-bit parameters directly; whether any does. ``names``: ``{id(p): name}``."""
        self.disarm()
        self._rows, self._names = [], dict(names)
        for opt in optimizers:
            if any(_is_16_bit(p) for g in opt.param_groups for p in g["params"]):
                self._handles += [opt.register_step_pre_hook(self._before), opt.register_step_post_hook(self._after)]
        return bool(self._handles)

    def disarm(self) -> None:
        """Remove the hooks (the step is over, or was skipped)."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._shadows = [], {}

    def stats(self) -> torch.Tensor | None:
        """The audited parameters' figures as one ``[params, 9]`` float64 device tensor; None if nothing stepped."""
        return torch.stack([row for _, row in self._rows]) if self._rows else None

    def report(self, values: Sequence[float], top: int = 3) -> UpdateReport:
        """The :class:`UpdateReport` from the host values of :meth:`stats` (flattened)."""
        params: dict[str, ParamUpdate] = {}
        err2 = int2 = 0.0
        for i, (name, _) in enumerate(self._rows):
            v = values[i * _COLUMNS : (i + 1) * _COLUMNS]
            if v[_SKIPPED]:
                continue  # a fused optimizer skipped the step for non-finite gradients: nothing was meant to land
            err2, int2 = err2 + v[_ERR2], int2 + v[_INT2]
            params[name] = ParamUpdate(
                name=name, count=int(v[_COUNT]), moving=int(v[_MOVING]),
                lost=int(v[_LOST]), discarded=math.sqrt(v[_ERR2] / v[_INT2]) if v[_INT2] > 0 else 0.0,
                decayed=int(v[_DECAYED]), decay_lost=int(v[_DECAY_LOST]), nonfinite=int(v[_NONFINITE]),
            )
        self._rows = []
        return UpdateReport(params=params, worst=_worst(params, top), discarded_share=math.sqrt(err2 / int2) if int2 > 0 else 0.0)

    # -- the optimizer's hooks ----------------------------------------------------------------------
    def _before(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        params = [p for g in opt.param_groups for p in g["params"] if _is_16_bit(p) and p.grad is not None]
        before = {id(p): p.detach().float() for p in params}
        after = _shadow_step(opt, params)
        self._shadows.update({i: (before[i], after[i]) for i in before})

    def _after(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        found = getattr(opt, "found_inf", None)  # a fused optimizer's own overflow flag (see optimizer_step)
        for group in opt.param_groups:
            wd = float(group.get("weight_decay") or 0.0)
            decay = group["lr"] * wd if wd else None  # lr may be a device tensor: no truth test on it (a sync)
            for p in group["params"]:
                if id(p) not in self._shadows:
                    continue
                before, intended_after = self._shadows.pop(id(p))
                row = _row(before, p.detach().float() - before, intended_after - before, decay, p.dtype, found)
                self._rows.append((self._names.get(id(p), "?"), row))


def _worst(params: dict[str, ParamUpdate], top: int) -> list[ParamUpdate]:
    ranked = sorted(
        (u for u in params.values() if u.lost or u.discarded or u.decay_lost or u.nonfinite), key=lambda u: (-u.nonfinite, -u.lost_share, -u.discarded)
    )
    return ranked[:top]


def _is_16_bit(p: torch.Tensor) -> bool:
    return p.dtype in (torch.bfloat16, torch.float16)


def _shadow_step(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """``{id(p): p after an fp32 step}``: ``opt``'s class and hyperparameters, fp32 clones of ``params``, their
    gradients and their state. The real optimizer and parameters are not touched."""
    wanted = {id(p) for p in params}
    scale = getattr(opt, "grad_scale", None)  # a fused optimizer that unscales inside its kernel sees scaled gradients
    clones: dict[int, torch.Tensor] = {}
    groups = []
    for group in opt.param_groups:
        mine = [p for p in group["params"] if id(p) in wanted]
        for p in mine:
            clone = p.detach().float().clone()
            clone.grad = p.grad.detach().float() if scale is None else p.grad.detach().float() / scale  # type: ignore[union-attr]
            clones[id(p)] = clone
        if mine:
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [clones[id(p)] for p in mine]})
    shadow = _same_optimizer(opt, groups)
    for p in params:
        state = opt.state.get(p)
        if state:
            shadow.state[clones[id(p)]] = {k: _fp32_copy(v) for k, v in state.items()}
    device = params[0].device if params else torch.device("cpu")
    # An optimizer that draws random numbers (stochastic rounding) must leave the real run's stream as it was.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        shadow.step()
    return clones


def _same_optimizer(opt: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """A fresh optimizer of ``opt``'s class over ``groups``; its defaults are passed where the constructor names
    them (the groups carry every hyperparameter anyway, but a constructor may require some, such as ``lr``)."""
    cls = type(opt)
    accepted = inspect.signature(cls.__init__).parameters
    if any(a.kind is inspect.Parameter.VAR_KEYWORD for a in accepted.values()):
        return cls(groups, **opt.defaults)
    return cls(groups, **{k: v for k, v in opt.defaults.items() if k in accepted})


def _fp32_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().float() if _is_16_bit(value) else value.detach().clone()
    return value


def _row(before: torch.Tensor, applied: torch.Tensor, intended: torch.Tensor, decay: float | torch.Tensor | None, dtype: torch.dtype, found: torch.Tensor | None) -> torch.Tensor:
    """One parameter's figures, on its device (no sync): the columns named at the top of the module."""
    finite = torch.isfinite(applied)
    applied = torch.where(finite, applied, intended)  # counted apart: an inf would swamp every other figure
    moving = intended != 0
    zero = torch.zeros((), dtype=torch.float64, device=before.device)
    if decay is not None:
        # The gap below |w| in ``dtype``: eps * 2^floor(log2|w|), halved at an exact power of two (the next
        # smaller value is then in the binade below). Round-to-nearest moves |w| only by more than half of it.
        mantissa, exponent = torch.frexp(before.abs())
        gap = torch.ldexp(torch.full_like(before, torch.finfo(dtype).eps), exponent - 1)
        gap = torch.where(mantissa == 0.5, gap / 2, gap)
        nonzero = before != 0
        decayed = nonzero.sum()
        decay_lost = (nonzero & (decay * before.abs() < gap / 2)).sum()
    else:
        decayed = decay_lost = zero
    return torch.stack([
        torch.full((), before.numel(), dtype=torch.float64, device=before.device),
        torch.linalg.vector_norm(applied - intended, dtype=torch.float64) ** 2,
        torch.linalg.vector_norm(intended, dtype=torch.float64) ** 2,
        moving.sum().double(),
        (moving & (applied == 0)).sum().double(),
        torch.as_tensor(decayed, dtype=torch.float64),
        torch.as_tensor(decay_lost, dtype=torch.float64),
        found.detach().double().reshape(()) if found is not None else zero,
        (~finite).sum().double(),
    ])
