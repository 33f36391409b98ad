"""The doctor's update-precision check: does ``bf16-true`` lose updates, and which remedy recovers fp32's training?

:func:`check_update_precision` trains ``steps`` optimizer steps of copies of the model from the same weights, on the
same batches with the same dropout masks: ``32-true`` (the control), ``bf16-true`` with the update audit
(:mod:`~ampkit.numerics._update_audit`) on every step and, if updates are lost, each remedy of
:data:`~ampkit.numerics._update_audit.REMEDIES` in the registry, cheapest first. Each run is judged on a held-out
batch in fp32 (same dropout mask): policy ``P`` *recovers* fp32's trajectory when its loss decrease over the steps is
at least :data:`RECOVERED_SHARE` of fp32's, ``L0 - L_K(P) >= RECOVERED_SHARE * (L0 - L_K(fp32))``. The cheapest
remedy that recovers is prescribed.

That bound judges only where fp32 itself improves: its held-out loss must fall by more than :data:`NOISE_FACTOR`
times the fall's noise, ``|d_A - d_B| / 2`` over the held-out batch's two halves (the standard error of the
whole batch's fall). Where it does not (fp32's loss rose, or fell by less than its own noise), the check is not
*judged*: the audit's findings stand, no remedy is tried, and the report says to train the check longer.

Before the policies, one targeted remedy is tried when the parameters that lose their updates are few (under
:data:`TARGETED_SHARE` of the model's): ``bf16-true`` with the modules that own them kept in fp32
(``keep_fp32=[...]``). Typically these are the normalisation gains, which start at 1.0, where bf16's gap is 2^-7.
Their fp32 weights, gradients and optimizer state cost a few bytes per *kept* parameter, a rounding error per model
parameter, and the optimizer and its speed stay as they are.

    >>> from torch import nn
    >>> torch.manual_seed(0); model = nn.Linear(4, 2)  # doctest: +ELLIPSIS
    <...>
    >>> batches = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
    >>> check = check_update_precision(model, batches[:2], batches[2], nn.functional.mse_loss,
    ...                                lambda ps: torch.optim.SGD(ps, lr=0.1), steps=2)
    >>> check.lost, check.prescribed, [t.policy for t in check.trials]
    (False, None, ['bf16-true'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._errors import one_line
from .._util.units import fmt_share
from ..policy import get_policy, policy_names
from ._compare import LossFn
from ._trial_runs import fall_noise, held_out_loss, train_copy
from ._update_audit import REMEDIES, UPDATE_DISCARDED_WARN, UPDATE_LOST_WARN, UpdateReport

__all__ = ["AUDITED_POLICY", "NOISE_FACTOR", "RECOVERED_SHARE", "TARGETED_SHARE", "RemedyTrial", "UpdatePrecision", "check_update_precision"]

RECOVERED_SHARE = 0.9
"""A policy recovers fp32's trajectory when its held-out loss falls by at least this share of what fp32's falls in the
same steps: close enough that the run follows fp32's, with room for the rounding every 16-bit forward adds."""
NOISE_FACTOR = 1.0
"""fp32's held-out loss must fall by more than this many times its noise (the standard error of the fall, from the
batch's halves) for the check to judge a remedy: a smaller fall could be the held-out batch's luck, and 90% of it
would then say nothing about a trajectory. One standard error, not two: estimated from two halves, the noise is
itself rough, and twice it already refused a 16-row check whose fall was clear (0.072 against a noise of 0.038)."""
AUDITED_POLICY = "bf16-true"
"""The policy audited: bf16 weights stepped directly, the one the remedies keep the model format of."""
TARGETED_SHARE = 0.01
"""The targeted remedy (their modules in fp32) is tried only when the parameters losing updates hold less than this
share of the model's: 8 bytes more per kept parameter (fp32 weight, gradient, Adam's two moments) is then under
0.08 B per model parameter, cheaper than any remedy but stochastic rounding, without changing the optimizer."""
STOCHASTIC_REMEDIES = frozenset({"bf16-true-sr"})
"""Remedies whose updates round at random: their trajectory over a few steps depends on the draws."""
STOCHASTIC_SEEDS = 3
"""A stochastic remedy recovers only if it does with each of this many random streams (the same batches and dropout
masks): over a check's few steps one lucky stream can land within the bound while the next misses it."""


@dataclass(frozen=True)
class RemedyTrial:
    """One policy trained for the check's steps: its held-out loss and whether it recovers fp32's decrease."""

    policy: str
    bytes_per_param: float | None
    """Bytes per parameter it adds beside the bf16 model (None for the audited policy itself)."""
    loss: float
    recovered: bool

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "bytes_per_param": self.bytes_per_param, "loss": self.loss, "recovered": self.recovered}


@dataclass
class UpdatePrecision:
    """What :func:`check_update_precision` found (doctor.json's ``update_precision``)."""

    steps: int
    initial_loss: float
    fp32_loss: float
    params: dict[str, dict[str, Any]]
    """Per parameter under ``bf16-true``, over all the steps (:meth:`UpdateReport.merge`): ``lost_share``,
    ``discarded_share`` (averaged), ``decay_lost_share``, ``nonfinite``."""
    lost: bool
    """Whether ``bf16-true`` loses updates: the audit over all steps warns (:meth:`UpdateReport.problems`), or it
    does not recover fp32's decrease."""
    problems: list[str] = field(default_factory=list)
    trials: list[RemedyTrial] = field(default_factory=list)
    """``bf16-true`` first, then the remedies tried, cheapest first."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Remedies not tried, and why: not in this ampkit's registry, cannot run on the device (a library missing),
    or refused the optimizer (stochastic rounding takes Adam and AdamW only)."""
    prescribed: str | None = None
    """The cheapest remedy that recovers; None when nothing is lost or no remedy recovers."""
    keep_fp32: list[str] = field(default_factory=list)
    """The modules the prescription keeps in fp32: the forward fixes, and with ``prescribed == "bf16-true"`` those the
    targeted remedy keeps."""
    fp32_noise: float | None = None
    """The noise of fp32's held-out fall, ``|d_A - d_B| / 2`` over the batch's halves; None for a one-row batch."""
    judged: bool = True
    """fp32's held-out loss fell by more than :data:`NOISE_FACTOR` times its noise, so remedies could be judged by it."""
    forward_keep: list[str] = field(default_factory=list)
    """The forward fixes every trial runs with: the modules the doctor's tailoring keeps in fp32 under ``bf16-true``
    (so a fault in the forward pass is not taken for lost updates)."""
    forward_fault: list[str] = field(default_factory=list)
    """Modules whose gradient still diverges from fp32 under ``bf16-true`` with the forward fixes applied: a fault of
    the forward pass, which no update remedy fixes (they change only how an update lands), so none is tried."""
    preferred: str | None = None
    """Why the prescription is preferred to ``bf16-true`` itself when ``bf16-true`` also recovers fp32's decrease over
    the check's steps (the audit finds parameters whose updates are lost: a longer run leaves them behind)."""

    def engine_kwargs(self) -> dict[str, Any] | None:
        """What to pass to ``Engine`` for the prescription; None when nothing is prescribed."""
        if self.prescribed is None:
            return None
        return {"precision": self.prescribed, **({"keep_fp32": list(self.keep_fp32)} if self.keep_fp32 else {})}

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "policy": AUDITED_POLICY, "recovered_share": RECOVERED_SHARE, "initial_loss": self.initial_loss,
            "fp32_loss": self.fp32_loss, "fp32_noise": self.fp32_noise, "noise_factor": NOISE_FACTOR, "judged": self.judged,
            "lost": self.lost, "problems": list(self.problems), "params": self.params,
            "trials": [t.to_dict() for t in self.trials], "skipped": dict(self.skipped), "prescribed": self.prescribed,
            "keep_fp32": list(self.keep_fp32), "forward_keep": list(self.forward_keep), "forward_fault": list(self.forward_fault),
            "preferred": self.preferred,
        }


def check_update_precision(
    model: nn.Module,
    batches: Sequence[Any],
    held_out: Any,
    loss_fn: LossFn,
    optimizer: Callable[[Any], torch.optim.Optimizer],
    *,
    steps: int = 8,
    seed: int = 0,
    keep_fp32: Sequence[str] = (),
    forward_fault: Sequence[str] = (),
) -> UpdatePrecision:
    """Train ``steps`` steps on ``batches`` (step ``i`` on ``batches[i % len(batches)]``) under ``32-true``,
    ``bf16-true`` (audited) and, if updates are lost, the remedies; judge each on ``held_out``. ``model`` is left
    untouched.

    ``keep_fp32`` are the forward fixes (modules kept in fp32 under ``bf16-true``), applied to every trial;
    ``forward_fault`` the modules that still diverge with them: then the audit runs, and no remedy is tried."""
    if steps < 1:
        raise ValueError(f"check_update_precision(steps={steps}): steps must be >= 1 (optimizer steps per policy).")
    initial = held_out_loss(model, None, held_out, loss_fn, seed)
    fp32 = train_copy(model, batches, loss_fn, optimizer, "32-true", steps, seed)[0]
    fp32_loss = held_out_loss(model, fp32, held_out, loss_fn, seed)
    noise = fall_noise(model, fp32, held_out, loss_fn, seed)
    # fp32 must have gone down, beyond its noise, for a decrease to be recovered: a rise is no trajectory to follow.
    judged = initial - fp32_loss > NOISE_FACTOR * (noise or 0.0)

    base = list(keep_fp32)

    def trial(policy: str, nbytes: float | None, stream: int = seed, keep: Sequence[str] = (), label: str | None = None) -> tuple[RemedyTrial, list[UpdateReport]]:
        kept = base + [m for m in keep if m not in base]
        trained, reports = train_copy(model, batches, loss_fn, optimizer, policy, steps, seed, audit=nbytes is None, stream=stream, keep_fp32=kept)
        loss = held_out_loss(model, trained, held_out, loss_fn, seed)
        recovered = judged and initial - loss >= RECOVERED_SHARE * (initial - fp32_loss)
        return RemedyTrial(label or policy, nbytes, loss, bool(recovered)), reports

    audited, reports = trial(AUDITED_POLICY, None)
    merged = UpdateReport.merge(reports)
    problems = merged.problems()
    result = UpdatePrecision(
        steps=steps, initial_loss=initial, fp32_loss=fp32_loss, params={n: u.to_dict() for n, u in merged.params.items()},
        # A forward fault is not a lost update: then only the audit's own findings say updates are lost.
        lost=bool(problems) or (judged and not audited.recovered and not forward_fault), problems=problems, trials=[audited],
        fp32_noise=noise, judged=judged, forward_keep=base, forward_fault=list(forward_fault),
    )
    # Unjudged: the audit's findings stand, and no remedy can be told to recover. A forward fault: no remedy fixes it.
    if not result.lost or not judged or forward_fault:
        return result
    keep, kept_share = _losing_modules(model, merged)
    keep = [m for m in keep if m not in base]
    if keep and kept_share < TARGETED_SHARE:
        tried = trial(AUDITED_POLICY, 8 * kept_share, keep=keep, label=f"{AUDITED_POLICY}, keep_fp32={base + keep}")[0]
        result.trials.append(tried)
        if tried.recovered:
            result.prescribed, result.keep_fp32 = AUDITED_POLICY, base + keep
            result.preferred = _preferred(f"{AUDITED_POLICY} with {', '.join(keep)} in fp32", audited, merged, steps)
            return result
    known = set(policy_names())
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    for name, nbytes in REMEDIES:
        if name not in known:
            result.skipped[name] = "not in this ampkit's policy registry"
            continue
        support = get_policy(name).support(device)
        if not support.supported:
            result.skipped[name] = support.reason
            continue
        try:
            tried = trial(name, nbytes)[0]
        except ValueError as error:  # the policy refuses this optimizer, naming why (e.g. SGD under stochastic rounding)
            result.skipped[name] = one_line(error)
            continue
        if tried.recovered and name in STOCHASTIC_REMEDIES:
            recovered = all(trial(name, nbytes, stream=seed + k)[0].recovered for k in range(1, STOCHASTIC_SEEDS))
            tried = RemedyTrial(name, nbytes, tried.loss, recovered)
        result.trials.append(tried)
        if tried.recovered:
            result.prescribed, result.keep_fp32 = name, list(base)
            result.preferred = _preferred(name, audited, merged, steps)
            break
    return result


def _preferred(remedy: str, audited: RemedyTrial, report: UpdateReport, steps: int) -> str | None:
    """Why a remedy is prescribed although ``bf16-true`` itself recovered fp32's decrease over the check's steps;
    None when it did not (then the remedy is simply the cheapest that recovers)."""
    if not audited.recovered:
        return None
    worst = sorted(report.params.values(), key=lambda u: -u.lost_share)[:3]
    found = ", ".join(f"{u.name} {fmt_share(u.lost_share)}" for u in worst if u.lost_share > 0) or "updates rounded away"
    return (
        f"{remedy} is preferred to plain {AUDITED_POLICY}, which also follows fp32's decrease over these {steps} steps, because "
        f"the audit finds its updates lost ({found}): over a longer run those parameters fall behind"
    )


def _losing_modules(model: nn.Module, report: UpdateReport) -> tuple[list[str], float]:
    """The modules owning the parameters whose updates the audit found lost (not only their decay), and the share of
    the model's parameters they hold. Empty when a losing parameter sits on the root module (nothing to name)."""
    losing = [name for name, u in report.params.items() if u.lost_share >= UPDATE_LOST_WARN or u.discarded >= UPDATE_DISCARDED_WARN]
    modules = sorted({name.rpartition(".")[0] for name in losing})
    if not modules or "" in modules:
        return [], 1.0
    kept = {id(p) for m in modules for p in model.get_submodule(m).parameters()}
    total = sum(p.numel() for p in model.parameters())
    return modules, sum(p.numel() for p in model.parameters() if id(p) in kept) / max(total, 1)
