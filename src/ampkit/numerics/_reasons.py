"""The recommendation's reasons, in words: why the doctor chose a policy, what it keeps in fp32, what the other
candidates did, the loss scale, and how the update-precision check joins a recommendation of bf16 weights.

    >>> recommendation_reasons(None, [], None)  # type: ignore[arg-type]
    ['no 16-bit mixed policy runs fast on this device: 32-true']
"""

from __future__ import annotations

from collections.abc import Sequence

from .._util.units import fmt_share
from ._recommend import Tailored
from ._scale import LossScaleAdvice
from ._update_remedy import UpdatePrecision

__all__ = ["recommendation_reasons", "with_update_remedy"]


def with_update_remedy(precision: str, keep: list[str], updates: UpdatePrecision, reasons: list[str]) -> tuple[str, list[str]]:
    """The recommendation when it is the audited policy itself (bf16 weights stepped directly, asked for with
    ``target``): the update check's prescription joins it, so the doctor prints one engine line, not two."""
    if updates.prescribed is not None:
        kept = keep + [m for m in updates.keep_fp32 if m not in keep]
        what = f"{updates.prescribed}" + (f" with {', '.join(updates.keep_fp32)} in fp32" if updates.keep_fp32 else "")
        reasons.append(f"{precision} loses updates; {what} recovers fp32's training over {updates.steps} steps (update precision, below)")
        if updates.preferred:
            reasons.append(updates.preferred)
        return updates.prescribed, kept
    if updates.lost:
        why = "no remedy tried recovers fp32's training" if updates.judged else "fp32's own loss did not fall enough to judge a remedy"
        reasons.append(f"{precision} loses updates and {why} (update precision, below): a policy with fp32 weights keeps them")
    return precision, keep


def recommendation_reasons(chosen: Tailored | None, tailored: Sequence[Tailored], advice: LossScaleAdvice) -> list[str]:
    out: list[str] = []
    if chosen is None:
        if any(t.comparison.finite for t in tailored):
            return out  # finite but diverging, and no fallback trains: the paste check's notes say so
        if tailored:
            out.append("no 16-bit policy trained a finite step even with modules kept in fp32: stay in 32-true")
        else:
            out.append("no 16-bit mixed policy runs fast on this device: 32-true")
        return out
    c = chosen.comparison
    worst = min((m.cosine for m in c.modules.values() if m.cosine is not None), default=None)
    agreement = f"gradients agree with fp32 (lowest module cosine {worst:.4f})" if worst is not None else "gradients stay finite"
    if c.diverging:
        agreement = f"{len(c.diverging)} module(s) still diverge from fp32 ({', '.join(c.diverging[:3])})"
    out.append(f"{chosen.precision}: one step is finite and {agreement}")
    if chosen.keep_fp32:
        out.append(f"{', '.join(chosen.keep_fp32)} must stay in fp32 under {chosen.precision}")
    for other in tailored:
        if other is not chosen and not other.agrees:
            why = "goes non-finite" if not other.comparison.finite else f"diverges in {', '.join(other.comparison.diverging[:3])}"
            out.append(f"{other.precision} {why} even as tailored")
    if chosen.loss_scale_log2 is not None:
        out.append(
            f"loss scale 2^{chosen.loss_scale_log2}: {fmt_share(advice.underflow_unscaled)} of gradient values are below fp16's 2^-24 "
            f"unscaled, {fmt_share(advice.underflow_scaled)} at 2^{advice.log2}"
        )
    return out
