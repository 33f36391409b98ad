"""The doctor result in lines of text, shared by the terminal and report.md: what ran, the recommended loss scale,
the recommendation, each comparison against the fp32 reference, the compiled-against-eager check and the
update-precision check.

    >>> header_lines({"workload": {"name": "toy", "size": "small"}, "device": "cpu", "reference_steps": 1})
    ['ampkit doctor: toy (size small)', 'device cpu · 1 fp32 reference step']
"""

from __future__ import annotations

from typing import Any

from .._report.dialect import FRAMEWORKS
from .._util.units import MISSING, fmt_float, fmt_share, is_missing
from ._cells import module_label
from ._engine_code import engine_code
from ._formats import FP16

__all__ = [
    "comparison_lines", "comparison_summary", "compile_lines", "header_lines", "loss_scale_line", "recommendation_lines",
    "update_lines",
]  # fmt: skip


def header_lines(data: dict[str, Any]) -> list[str]:
    """What ran: workload (and size), its description, device, torch and how many fp32 reference steps."""
    workload = data.get("workload") or {}
    title = f"ampkit doctor: {workload['name']}" if workload.get("name") else "ampkit doctor"  # diagnose() names none
    if workload.get("size"):
        title += f" (size {workload['size']})"
    lines = [title]
    if workload.get("description"):
        lines.append(str(workload["description"]))
    facts = [f"device {data.get('device') or 'unknown'}"]
    facts += [f"torch {data['torch']}"] if data.get("torch") else []
    steps = data.get("reference_steps")
    facts += [f"{steps} fp32 reference step{'s' if steps != 1 else ''}"] if steps is not None else []
    lines.append(" · ".join(facts))
    return lines


def _scale_value(scale: float) -> str:
    # Whole up to seven digits (8192, 131072); beyond, 1.07e+09 reads better than 1073741824.
    return f"{scale:.0f}" if 1 <= scale < 1e7 else f"{scale:.3g}"


def loss_scale_line(data: dict[str, Any]) -> str | None:
    """The recommended fp16 loss scale and why, as the classic underflow finding; None when there is none.

    >>> loss_scale_line({"recommended_loss_scale": 1024.0, "loss_scale_log2": 10,
    ...                  "underflow_share_unscaled": 0.031, "underflow_share_scaled": 2e-6})
    'Loss scale 2^10 (1024): 3.1% of gradient values below 2^-24 unscaled, <0.01% at 2^10.'
    """
    k, scale = data.get("loss_scale_log2"), data.get("recommended_loss_scale")
    if k is None or is_missing(scale):
        return None
    lowest = FP16.exponent_range[0]
    unscaled, scaled = data.get("underflow_share_unscaled"), data.get("underflow_share_scaled")
    return (
        f"Loss scale 2^{k} ({_scale_value(scale)}): {fmt_share(unscaled)} of gradient values below "
        f"2^{lowest} unscaled, {fmt_share(scaled)} at 2^{k}."
    )


def recommendation_lines(data: dict[str, Any]) -> list[str]:
    """The recommendation in words: precision and reasons, loss scale, modules kept in fp32, the Engine line; for a
    model from a framework (doctor.json's ``framework``), its script's lines first (``framework_code``)."""
    precision = data.get("recommended_precision") or MISSING
    target = data.get("target")
    lines = [f"Recommended precision: {precision}" + (f" (tailored for {target})" if target else "")]
    lines += [f"  - {reason}" for reason in data.get("precision_reasons") or []]
    scale = loss_scale_line(data)
    if scale:
        # The scale is measured either way; say when the chosen policy does not need it (bf16 keeps fp32's range).
        needed = str(precision).startswith("16")
        lines.append(scale + ("" if needed else " (only fp16 needs a loss scale)"))
    kept = [module_label(name) for name in data.get("keep_fp32") or []]
    lines.append(f"Keep in fp32: {', '.join(kept) if kept else 'nothing'}")
    framework = FRAMEWORKS.get(data.get("framework") or "")
    if framework and data.get("framework_code"):  # the user's own framework first; the Engine line for a plain loop
        lines += [f"Paste into your {framework} script:", *str(data["framework_code"]).splitlines()]
        if data.get("engine_code"):
            lines.append(f"Or, in a plain PyTorch loop: {data['engine_code']}")
    elif data.get("engine_code"):
        lines.append(f"Paste: {data['engine_code']}")
    return lines


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(module_label(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def comparison_summary(comp: dict[str, Any]) -> str:
    """Whether a comparison run stayed finite (with its loss) or where it first broke, and what diverged.

    >>> comparison_summary({"finite": False, "forward_origin": "fc2", "diverging": ["fc2", "fc3"]})
    'non-finite, first in the forward pass at fc2; 2 modules diverge: fc2, fc3'
    """
    if comp.get("finite", True):
        state = "finite"
        if not is_missing(comp.get("loss")):
            state += f", loss {fmt_float(comp['loss'])} vs fp32 {fmt_float(comp.get('reference_loss'))}"
    else:
        phases = (("forward", "forward_origin"), ("backward", "backward_origin"))
        where = [f"the {phase} pass at {module_label(comp[key])}" for phase, key in phases if comp.get(key) is not None]
        state = "non-finite, first in " + " and ".join(where) if where else "non-finite (origin not found)"
    diverging = comp.get("diverging") or []
    count = f"{len(diverging)} modules diverge" if len(diverging) != 1 else "1 module diverges"
    return f"{state}; {count}" + (f": {_names(diverging)}" if diverging else "")


def comparison_lines(data: dict[str, Any]) -> list[str]:
    """One line per comparison run: label and policy, then :func:`comparison_summary`."""
    return [f"{c.get('label', '?')} ({c.get('policy') or MISSING}): {comparison_summary(c)}" for c in data.get("comparisons") or []]


def compile_lines(check: dict[str, Any]) -> list[str]:
    """The compiled-against-eager check (doctor.json's ``compile_check``): its verdict, then what to do.

    >>> compile_lines({"verdict": "compiled step diverges from eager under bf16-mixed: fc off", "advice": ["keep fc eager"]})
    ['compiled step diverges from eager under bf16-mixed: fc off', 'what to do: keep fc eager']
    """
    return [str(check.get("verdict") or MISSING)] + [f"what to do: {a}" for a in check.get("advice") or []]


def update_lines(data: dict[str, Any], top: int = 5) -> list[str]:
    """The update-precision check (doctor.json's ``update_precision``, see :mod:`ampkit.numerics._update_remedy`) as
    lines for the terminal and report.md: the verdict, the worst parameters, each remedy tried, the prescription.

    >>> update_lines({"steps": 4, "lost": False, "initial_loss": 1.0, "fp32_loss": 0.5, "params": {}, "trials": []})
    ['bf16-true keeps its updates over 4 steps (held-out loss 1 -> 0.5 in fp32)']
    """
    head = f"over {data['steps']} steps (held-out loss {data['initial_loss']:.4g} -> {data['fp32_loss']:.4g} in fp32)"
    policy = data.get("policy") or "bf16-true"
    judged = data.get("judged", True)
    fixes = data.get("forward_keep") or []
    if fixes:  # the forward fixes the check ran with: a forward fault is not taken for lost updates
        policy += f" (with the forward fixes applied: {', '.join(module_label(n) for n in fixes)} in fp32)"
    fault = data.get("forward_fault") or []
    if not data.get("lost") and judged and not fault:
        return [f"{policy} keeps its updates {head}"]
    lines = [f"{policy} {'loses updates' if data.get('lost') else 'keeps its updates, by the audit,'} {head}"]
    if fault:
        lines.append(
            f"  its forward pass still diverges from fp32 in {', '.join(module_label(n) for n in fault[:3])}: a fault of the "
            "activations, not of the updates, which no update remedy fixes (they change only how an update lands); none was tried"
        )
    ranked = sorted(data.get("params", {}).items(), key=lambda kv: (-kv[1]["lost_share"], -kv[1]["discarded_share"]))
    for name, p in ranked[:top]:
        decay = f", decay {fmt_share(p['decay_lost_share'])} lost" if p.get("decay_lost_share") is not None else ""
        lines.append(f"  {name or '(model)'}: {fmt_share(p['lost_share'])} lost, {fmt_share(p['discarded_share'])} discarded{decay}")
    for t in data.get("trials", []):
        cost = f" (+{t['bytes_per_param']:.3g} B/param)" if t.get("bytes_per_param") is not None else ""
        verdict = f", {'recovers' if t['recovered'] else 'does not recover'} fp32's decrease" if judged else ""
        lines.append(f"  {t['policy']}{cost}: held-out loss {t['loss']:.4g}{verdict}")
    if not judged:
        lines.append(_unjudged_line(data))
        return lines
    if fault:
        return lines
    for name, why in (data.get("skipped") or {}).items():
        lines.append(f"  {name}: not tried: {why}")
    if data.get("prescribed") and data.get("preferred"):
        lines.append(f"  {data['preferred']}")
    lines.append(_update_prescription(data))
    return lines


def _update_prescription(data: dict[str, Any]) -> str:
    """The check's last line. The doctor prints one recommendation (the ``Paste:`` line): the check's prescription is
    either part of it (the recommended policy steps bf16 weights) or an option beside it, to hold the weights in bf16
    where the recommendation keeps them in fp32, and the line says which."""
    prescribed = data.get("prescribed")
    if not prescribed:
        return "No remedy tried recovers fp32's decrease: keep fp32 weights (a mixed policy) or train longer to judge"
    code = data.get("engine_code") or engine_code(prescribed, data.get("keep_fp32") or ())
    if data.get("applied"):
        return f"Prescribed, and part of the recommendation above: {code}"
    if data.get("recommendation_fp32_weights", True):
        return f"Only to hold the weights in bf16 (the recommendation above keeps them in fp32): {code}"
    return f"Beside the recommendation above, what recovers {data.get('policy') or 'bf16-true'}'s updates: {code}"


def _unjudged_line(data: dict[str, Any]) -> str:
    """Why an update check whose fp32 reference did not improve judges no remedy, and how to make it judge."""
    fall, noise = data["initial_loss"] - data["fp32_loss"], data.get("fp32_noise")
    factor = data.get("noise_factor", 1.0)
    how = "rose" if fall <= 0 else f"fell by {fall:.2g}, within {'' if factor == 1 else f'{factor:g}x '}its noise ({noise:.2g})"
    return (
        f"fp32's own held-out loss {how} over {data['steps']} steps: with no fall to follow, the check cannot judge any "
        f"remedy, so none was tried. Train it longer: --update-steps {4 * data['steps']} "
        f"(diagnose(update_steps={4 * data['steps']}))"
    )
