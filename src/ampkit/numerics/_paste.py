"""The configuration the doctor pastes: never one its own report says still diverges.

Tailoring (:func:`~ampkit.numerics._recommend.tailor`) keeps modules in fp32 until a policy's step agrees with fp32's.
It cannot always get there: under ``bf16-true`` the weights *and* the activations flowing between modules are bf16,
and a module kept in fp32 hands its output back in bf16, so a fault in the activations (a shift that bf16's 8 bits
cannot hold, then a norm that removes it) survives any ``keep_fp32``. :func:`settle_paste` then decides by training:

1. the tailored policy is trained for a few steps against fp32 (:class:`~ampkit.numerics._train_check.TrainingJudge`);
   if it follows fp32's decrease, its one-step divergence does not matter and it is pasted, the report saying so;
2. otherwise the nearest configurations (:func:`fallbacks`: the same 16-bit format with fp32 weights first, then the
   other fast mixed policies) are tailored and trained in turn, and the first that trains is pasted instead;
3. none trains: stay in ``32-true``.

Without an optimizer (nothing to train) or where fp32's own loss did not fall beyond its noise (nothing to follow),
a configuration counts as training when its tailored step agrees with fp32, and the report says it was checked by
one step only.

    >>> fallbacks("bf16-true", torch.device("cpu"))
    ['bf16-mixed']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..policy import get_policy
from ._engine_code import engine_code
from ._recommend import PREFERENCE, Tailored
from ._train_check import TrainingJudge, TrainTrial

__all__ = ["PasteCheck", "fallbacks", "settle_paste"]


@dataclass
class PasteCheck:
    """How the paste was settled when the tailored policy still diverged (doctor.json's ``paste_check``)."""

    asked: str
    """The policy whose tailored step still diverges from fp32."""
    diverging: list[str]
    pasted: str | None = None
    """The configuration pasted: ``asked`` itself when it trains, a fallback, or None (stay in ``32-true``)."""
    trials: list[TrainTrial] = field(default_factory=list)
    """Each configuration trained against fp32, in the order tried."""
    notes: list[str] = field(default_factory=list)
    """What was found, in words, in order: printed among the recommendation's reasons."""

    def to_dict(self) -> dict[str, Any]:
        return {"asked": self.asked, "diverging": list(self.diverging), "pasted": self.pasted,
                "trials": [t.to_dict() for t in self.trials], "notes": list(self.notes)}  # fmt: skip


def _format(name: str) -> torch.dtype | None:
    policy = get_policy(name)
    return policy.compute_dtype or policy.param_dtype


def fallbacks(precision: str, device: torch.device) -> list[str]:
    """The configurations to try, nearest first, when ``precision`` does not train as tailored: the mixed policies
    (fp32 weights) of :data:`~ampkit.numerics._recommend.PREFERENCE` that run on ``device``, those computing in
    ``precision``'s 16-bit format first, then the others that run fast there."""
    same = [n for n in PREFERENCE if n != precision and _format(n) == _format(precision) and get_policy(n).support(device).supported]
    fast = [n for n in PREFERENCE if n != precision and n not in same and get_policy(n).support(device).fast]
    return same + fast


def _scale(t: Tailored) -> float | None:
    return 2.0**t.loss_scale_log2 if t.loss_scale_log2 is not None else None


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(n or "(model)" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _what_fails(t: Tailored) -> str:
    if not t.comparison.finite:
        return "its step goes non-finite"
    kept = f" with {_names(t.keep_fp32)} in fp32" if t.keep_fp32 else ""
    return f"{_names(t.comparison.diverging)} still diverge{'s' if len(t.comparison.diverging) == 1 else ''} from fp32{kept}"


def settle_paste(
    chosen: Tailored | None,
    tailored: Sequence[Tailored],
    *,
    tailor_fn: Callable[[str], Tailored],
    make_judge: Callable[[], TrainingJudge] | None,
    device: torch.device,
) -> tuple[Tailored | None, list[Tailored], PasteCheck | None]:
    """(the configuration to paste, the policies tailored here beyond ``tailored``, how it was settled).

    ``chosen`` is returned as it is when its step agrees with fp32 (no check); None (every policy of ``tailored`` went
    non-finite) tries the fallbacks of the first. ``tailor_fn(name)`` tailors a fallback;
    ``make_judge()`` builds the fp32 control run (called at most once, only when a check needs it; None: no
    optimizer, nothing can be trained)."""
    if chosen is not None and chosen.agrees:
        return chosen, [], None
    failing = chosen or (tailored[0] if tailored else None)  # None chosen: every candidate went non-finite
    if failing is None:
        return None, [], None  # nothing ran: no 16-bit policy is fast on this device
    check = PasteCheck(asked=failing.precision, diverging=list(failing.comparison.diverging))
    judge = make_judge() if make_judge is not None else None
    measured = judge is not None and judge.judged
    if chosen is None:
        check.notes.append(f"{failing.precision}: {_what_fails(failing)} even as tailored")
    elif judge is not None and measured:
        trial = judge.trial(chosen.precision, chosen.keep_fp32, _scale(chosen))
        check.trials.append(trial)
        if trial.trains:
            check.pasted = chosen.precision
            check.notes.append(
                f"{chosen.precision}: {_what_fails(chosen)} in one step, but trained it follows fp32's decrease "
                f"({trial.describe()}): the divergence does not change training, so it is pasted"
            )
            return chosen, [], check
        check.notes.append(f"{chosen.precision} does not train as tailored: {_what_fails(chosen)} ({trial.describe()}); keep_fp32 cannot fix it")
    else:
        why = "no training check ran: no optimizer, or update_steps 0" if judge is None else "fp32's own held-out loss did not fall beyond its noise"
        check.notes.append(f"{chosen.precision}: {_what_fails(chosen)} and keep_fp32 cannot fix it ({why}, so configurations are checked by one step)")
    known = {t.precision: t for t in tailored}
    extra: list[Tailored] = []
    for name in fallbacks(failing.precision, device):
        candidate = known.get(name)
        if candidate is None:
            candidate = tailor_fn(name)
            extra.append(candidate)
        if not candidate.agrees:
            check.notes.append(f"{name}: {_what_fails(candidate)}")
            continue
        code = engine_code(name, candidate.keep_fp32)
        if judge is not None and measured:
            trial = judge.trial(name, candidate.keep_fp32, _scale(candidate))
            check.trials.append(trial)
            if not trial.trains:
                check.notes.append(f"{code} does not train either: {trial.describe()}")
                continue
            check.notes.append(f"pasted instead, the nearest configuration that trains: {code}, {trial.describe()}")
        else:
            check.notes.append(f"pasted instead, the nearest configuration whose step agrees with fp32: {code}")
        check.pasted = name
        return candidate, extra, check
    if judge is not None and not measured:
        longer = 4 * judge.steps
        check.notes.append(
            f"no 16-bit configuration tried agrees with fp32, and fp32's own loss did not fall over {judge.steps} steps to measure "
            f"whether one trains all the same: stay in 32-true, or measure it over more steps (--update-steps {longer}, "
            f"diagnose(update_steps={longer}))"
        )
    else:
        check.notes.append("no 16-bit configuration tried trains this model: stay in 32-true")
    return None, extra, check
