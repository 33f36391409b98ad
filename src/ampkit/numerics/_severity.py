"""Per-module entries of the doctor's report: statistics, the problems they show, and a severity to sort by.

Severity orders the table worst first. Its weights follow consequences: values non-finite already in fp32
(a bug, not precision) outrank a step that goes non-finite under the policy, which outranks activations that
overflow fp16 (inf on the first such batch), a gradient that diverges from fp32, gradients that flush to zero
even at the recommended loss scale, and last, underflow that the loss scale fixes.

    >>> from ampkit.numerics._stats import StatsAccumulator
    >>> acc = StatsAccumulator(); acc.update(torch.tensor([1e6, 1.0]))
    >>> problems_and_severity({"outputs": acc.summary()}, None, scale_log2=10)[0]
    ['outputs overflow fp16: 50.0% above 65504']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._util.units import fmt_share
from ._compare import ModuleAgreement, StepComparison
from ._scale import LossScaleAdvice
from ._stats import KINDS, TensorStats

__all__ = ["module_entries", "problems_and_severity", "KIND_LABELS"]

KIND_LABELS = {"weights": "weights", "grads": "weight gradients", "inputs": "inputs", "outputs": "outputs", "output_grads": "activation gradients"}
"""How each kind of statistics is named in prose."""


def problems_and_severity(stats: dict[str, TensorStats], agreement: ModuleAgreement | None, *, scale_log2: int) -> tuple[list[str], float]:
    """Readable problems of one module and a severity score (0: nothing to report)."""
    problems: list[str] = []
    severity = 0.0
    for kind in KINDS:
        s = stats.get(kind)
        if s is None or not s.count:
            continue
        label = KIND_LABELS[kind]
        if s.nonfinite:
            problems.append(f"{label} non-finite already in fp32 ({fmt_share(s.nonfinite / s.count)})")
            severity += 1000
        over = s.share("fp16", "overflow")
        if over and kind in ("inputs", "outputs", "weights"):
            problems.append(f"{label} overflow fp16: {fmt_share(over)} above 65504")
            severity += 100 + 100 * over
        if kind in ("grads", "output_grads"):
            over_scaled = s.max_abs * 2.0**scale_log2 > 65504
            under = s.underflow_share("fp16")
            under_scaled = s.underflow_share("fp16", scale_log2)
            if over_scaled:
                problems.append(f"{label} overflow fp16 at loss scale 2^{scale_log2}")
                severity += 50
            if under_scaled:
                problems.append(f"{label}: {fmt_share(under_scaled)} flush to zero in fp16 even at loss scale 2^{scale_log2}")
                severity += 20 + 100 * under_scaled
            elif under:
                problems.append(f"{label}: {fmt_share(under)} below 2^-24 unscaled (the loss scale fixes it)")
                severity += 10 * under
    if agreement is not None:
        if agreement.nonfinite:
            problems.append("gradient non-finite under the policy")
            severity += 200
        elif agreement.diverges:
            cos = "n/a" if agreement.cosine is None else f"{agreement.cosine:.4f}"
            rel = "n/a" if agreement.rel_error is None else f"{agreement.rel_error:.3g}"
            problems.append(f"gradient diverges from fp32 (cosine {cos}, rel. error {rel})")
            severity += 30 + 100 * (1 - (agreement.cosine or 0.0))
    return problems, severity


def module_entries(
    model: nn.Module,
    stats: dict[str, dict[str, TensorStats]],
    order: Sequence[str],
    advice: LossScaleAdvice,
    comparisons: Sequence[StepComparison],
    keep_fp32: Sequence[str],
) -> list[dict[str, Any]]:
    """One doctor.json entry per module that saw any values, worst first (severity, then forward order)."""
    position = {name: i for i, name in enumerate(order)}
    recommended = next((c for c in comparisons if c.label == "recommended"), None)
    default = next((c for c in comparisons if c.label == "default"), None)
    scale_log2 = advice.log2
    if recommended is not None and recommended.loss_scale is not None:
        scale_log2 = round(math.log2(recommended.loss_scale))  # tailoring may have lowered it
    entries = []
    for name, module in model.named_modules():
        s = stats.get(name)
        if not s:
            continue
        agreement = recommended.modules.get(name) if recommended is not None else None
        problems, severity = problems_and_severity(s, agreement, scale_log2=scale_log2)
        if default is not None:
            as_it_comes = f"under {default.policy} as it comes" + (f" (loss scale 2^{round(math.log2(default.loss_scale))})" if default.loss_scale else "")
            if default.forward_origin == name:
                problems.insert(0, f"output goes non-finite {as_it_comes}")
                severity += 300
            elif name in default.diverging and not (agreement is not None and agreement.diverges):
                problems.insert(0, f"gradient diverges from fp32 {as_it_comes}")
                severity += 60
        if name in keep_fp32:
            problems.append("kept in fp32 by the recommendation")
        entries.append({
            "name": name,
            "type": type(module).__name__,
            "order": position.get(name, len(position)),
            "parameters": sum(p.numel() for p in module.parameters(recurse=False)),
            **{kind: (s[kind].to_dict() if kind in s else None) for kind in KINDS},
            "problems": problems,
            "severity": severity,
            "keep_fp32": name in keep_fp32,
        })
    entries.sort(key=lambda e: (-e["severity"], e["order"]))
    return entries


_ = torch  # doctest namespace
