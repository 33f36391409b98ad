"""One sample of how a training step's gradients and activations fit fp16: the figures, the worst modules, the
problems with their fixes. Taken by :class:`~ampkit.numerics.NumericsSampler`; :func:`build_sample`
makes one from host-side statistics.

    >>> from ampkit.numerics._stats import StatsAccumulator
    >>> acc = StatsAccumulator(rounding=False); acc.update(torch.tensor([1.0, 0.5]))
    >>> build_sample(3, 2.0**10, {"fc": {"grads": acc.summary()}}, activations=False).suggested_scale == 2.0**25
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch  # noqa: F401  (the examples in the docstrings use it)

from .._util.units import fmt_share
from ._formats import FP16
from ._scale import largest_safe_log2
from ._stats import TensorStats
from ._update_audit import UpdateReport

__all__ = ["NumericsSample", "ModuleIssue", "build_sample"]

_FLUSH_WARN = 0.01
"""Share of gradient values below fp16's smallest subnormal above which a sample warns."""


@dataclass(frozen=True)
class ModuleIssue:
    """A module's worst problem in a sample: ``issue`` is ``"non-finite"``, ``"underflow"`` (gradient values
    below fp16's 2^-24 at the sample's loss scale) or ``"overflow"`` (outputs above fp16's 65504); ``share``
    is the share of the values concerned."""

    name: str
    issue: str
    share: float

    def __str__(self) -> str:
        return f"{_label(self.name)} ({fmt_share(self.share)} {self.issue})"


@dataclass
class NumericsSample:
    """How one optimizer step's gradients and activations fit fp16 (see :mod:`ampkit.numerics._sampler`).

    Gradient figures are of the gradients as the backward produced them, multiplied by the loss scale
    (``scale``; None without scaling, where they count as scaled by 1). Where those gradients are fp16
    already, values fp16 flushed are zeros by now: watch ``grad_zero_share`` there.
    """

    step: int
    """The optimizer step sampled (``engine.steps`` after it)."""
    scale: float | None
    """The loss scale the gradients carry; None when the loss is not scaled."""
    modules: dict[str, dict[str, TensorStats]]
    """``{module name: {kind: TensorStats}}``, kinds ``grads`` (own parameters, scaled), ``inputs``,
    ``outputs`` and ``output_grads`` (scaled). Names as ``named_modules()`` gives them (``""`` is the model
    itself), prefixed by the model's index when the engine holds several."""
    worst: list[ModuleIssue] = field(default_factory=list)
    """Up to ``top`` modules with a problem, worst first: non-finite values, then the largest share of
    underflowing gradients or overflowing outputs. A module is charged only with what it starts (outputs
    that overflow from inputs that did not, say), not with what it passes on, and a container only when
    none of its modules shows the same problem."""
    fp16: bool = True
    """Whether fp16's limits bind this run (it stores or computes in fp16, or scales its loss). When they do
    not (bf16, fp32), the fp16 figures are information and only non-finite values make :attr:`problems`."""
    activations: bool = False
    """Whether activations were recorded for this step."""
    fp32_modules: tuple[str, ...] = ()
    """Modules the policy keeps in fp32 (``keep_fp32``): values above 65504 in them, or starting there, are
    intended and fp32 holds them, so they are neither named worst for overflow nor warned about."""
    problems: list[str] = field(default_factory=list)
    """What is wrong, each with its fix; logged as a WARNING. Empty when all is well."""
    updates: UpdateReport | None = None
    """The step's update audit (:mod:`~ampkit.numerics._update_audit`): how much of the update the optimizer
    computed landed in the 16-bit weights it steps directly. None when the step was not audited: the optimizer
    steps no 16-bit weight (master weights step fp32 and lose nothing), or ``NumericsSampler(updates=False)``."""
    _merged: dict[str, TensorStats] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- merged figures ---------------------------------------------------------------------------
    def merged(self, kind: str) -> TensorStats:
        """The statistics of ``kind`` over all modules (each module's outputs count, a container's too)."""
        # Cached: every figure below reads a merge, and merging sums a histogram per module.
        if kind not in self._merged:
            self._merged[kind] = TensorStats.merge(kinds[kind] for kinds in self.modules.values() if kind in kinds)
        return self._merged[kind]

    @property
    def grad_zero_share(self) -> float:
        g = self.merged("grads")
        return g.zeros / g.count if g.count else 0.0

    @property
    def grad_underflow_share(self) -> float:
        """Share of (scaled) gradient values fp16 flushes to zero: below 2^-24."""
        return self.merged("grads").share(FP16, "underflow")

    @property
    def grad_subnormal_share(self) -> float:
        """Share of (scaled) gradient values fp16 holds as subnormals, with fewer bits: 2^-24 to 2^-14."""
        return self.merged("grads").share(FP16, "subnormal")

    @property
    def grad_max_abs(self) -> float:
        """Largest finite (scaled) gradient magnitude."""
        return self.merged("grads").max_abs

    @property
    def grad_nonfinite(self) -> int:
        return self.merged("grads").nonfinite

    @property
    def headroom(self) -> float | None:
        """``log2(65504 / max|scaled grad|)``: binades the scale could still grow by; negative means the scaled
        gradients overflow fp16, ``-inf`` that they hold inf/NaN already. None when every gradient is zero."""
        g = self.merged("grads")
        if g.nonfinite:
            return -math.inf
        return math.log2(FP16.max / g.max_abs) if g.max_abs > 0 else None

    @property
    def suggested_scale(self) -> float | None:
        """The largest power of two that keeps the largest unscaled gradient within fp16's 65504 once scaled.

        None when the gradients hold inf/NaN (their true size is unknown) or are all zero.
        """
        g = self.merged("grads")
        if g.nonfinite or g.max_abs <= 0:
            return None
        return math.ldexp(1.0, largest_safe_log2(g.max_abs / (self.scale or 1.0)))

    @property
    def act_max_abs(self) -> float | None:
        return self.merged("outputs").max_abs if self.activations else None

    @property
    def act_overflow(self) -> int | None:
        """Finite output values above fp16's 65504 (an fp16 forward would have made them inf)."""
        return self.merged("outputs").overflow["fp16"] if self.activations else None

    @property
    def act_overflow_share(self) -> float | None:
        return self.merged("outputs").share(FP16, "overflow") if self.activations else None

    @property
    def act_nonfinite(self) -> int | None:
        return self.merged("outputs").nonfinite if self.activations else None

    @property
    def act_grad_underflow_share(self) -> float | None:
        """Share of (scaled) gradients flowing into module outputs that fall below fp16's 2^-24."""
        return self.merged("output_grads").share(FP16, "underflow") if self.activations else None

    # -- export -----------------------------------------------------------------------------------
    def to_scalars(self) -> dict[str, float]:
        """Flat ``{"numerics/<figure>": value}`` for a metrics logger; figures that do not apply are left out.

        >>> s = NumericsSample(step=1, scale=None, modules={})
        >>> s.to_scalars()["numerics/grad_underflow_share"], "numerics/act_max_abs" in s.to_scalars()
        (0.0, False)
        """
        figures: dict[str, float | int | None] = {
            "loss_scale": self.scale,
            "grad_zero_share": self.grad_zero_share,
            "grad_underflow_share": self.grad_underflow_share,
            "grad_subnormal_share": self.grad_subnormal_share,
            "grad_max_abs": self.grad_max_abs,
            "grad_nonfinite": self.grad_nonfinite,
            "grad_headroom": self.headroom,
            "suggested_scale": self.suggested_scale,
            "act_max_abs": self.act_max_abs,
            "act_overflow_share": self.act_overflow_share,
            "act_nonfinite": self.act_nonfinite,
            "act_grad_underflow_share": self.act_grad_underflow_share,
            **(self.updates.figures() if self.updates is not None else {}),
        }
        return {f"numerics/{k}": float(v) for k, v in figures.items() if v is not None}

    def __str__(self) -> str:
        scale = f"scale {_scale_text(self.scale)}" if self.scale is not None else "no loss scaling"
        head = self.headroom
        if head is None:
            headroom = "headroom n/a (all zero)"
        elif head == -math.inf:
            headroom = "headroom none (non-finite)"
        else:
            headroom = f"headroom 2^{math.floor(head)}" + (" (overflow)" if head < 0 else "")
        grads = (
            f"grads {fmt_share(self.grad_underflow_share)} below fp16's 2^-24, {fmt_share(self.grad_subnormal_share)} subnormal, "
            f"{fmt_share(self.grad_zero_share)} zero, {headroom}"
        )
        if self.grad_nonfinite:
            grads += f", {self.grad_nonfinite} non-finite"
        if self.suggested_scale is not None:
            grads += f", suggested scale {_scale_text(self.suggested_scale)}"
        if self.activations:
            acts = f"activations max {self.act_max_abs:.2g}, {self.act_overflow} above fp16's 65504"
            if self.act_nonfinite:
                acts += f", {self.act_nonfinite} non-finite"
        else:
            acts = "activations not recorded"
        worst = ", ".join(str(w) for w in self.worst) or "none"
        updates = f"; {self.updates}" if self.updates is not None and self.updates.params else ""
        return f"numerics @ step {self.step} ({scale}): {grads}; {acts}; worst: {worst}{updates}"


def build_sample(
    step: int,
    scale: float | None,
    modules: dict[str, dict[str, TensorStats]],
    *,
    top: int = 3,
    fp16: bool = True,
    activations: bool = True,
    fp32_modules: tuple[str, ...] = (),
    updates: UpdateReport | None = None,
) -> NumericsSample:
    """A :class:`NumericsSample` from host-side statistics: ranks the worst modules and states the problems.

    >>> from ampkit.numerics._stats import StatsAccumulator
    >>> acc = StatsAccumulator(rounding=False)
    >>> acc.update(torch.tensor([1.0, 2.0**-30, 2.0**-30, 0.5]))   # scaled gradients, at scale 2^8
    >>> s = build_sample(7, 256.0, {"fc": {"grads": acc.summary()}}, activations=False)
    >>> s.grad_underflow_share, s.suggested_scale == 2.0**23, [str(w) for w in s.worst]
    (0.5, True, ['fc (50.0% underflow)'])
    """
    sample = NumericsSample(
        step=step, scale=scale, modules=modules, fp16=fp16, activations=activations, fp32_modules=tuple(fp32_modules), updates=updates
    )
    sample.worst = _worst(modules, top, sample.fp32_modules)
    sample.problems = _problems(sample) + (updates.problems() if updates is not None else [])
    return sample


# ------------------------------------------------------------------------------------------ helpers
def _in_fp32(name: str, fp32_modules: tuple[str, ...]) -> bool:
    return any(name == m or _contains(m, name) for m in fp32_modules)


def _worst(modules: dict[str, dict[str, TensorStats]], top: int, fp32_modules: tuple[str, ...] = ()) -> list[ModuleIssue]:
    candidates: list[tuple[tuple[float, ...], ModuleIssue]] = []
    for index, (name, kinds) in enumerate(modules.items()):
        issue = _own_issue(name, kinds)
        if issue is None or (issue.issue == "overflow" and _in_fp32(name, fp32_modules)):
            continue
        rank = 2.0 if issue.issue == "non-finite" else 1.0
        # Ties go to the deeper module: a container's output is often its last child's, and the child is the
        # one to act on.
        depth = name.count(".") + (name != "")
        candidates.append(((-rank, -issue.share, -depth, index), issue))
    # A container showing what one of its modules already shows adds nothing: the inner module is named.
    kept = [c for c in candidates if not any(o is not c and o[1].issue == c[1].issue and _contains(c[1].name, o[1].name) for o in candidates)]
    return [issue for _, issue in sorted(kept, key=lambda c: c[0])[:top]]


def _own_issue(name: str, kinds: dict[str, TensorStats]) -> ModuleIssue | None:
    """The module's worst problem among those it causes rather than inherits, or None.

    Overflow and inf/NaN spread: every module downstream of the one that overflowed sees them in its inputs
    (forward), every module upstream in its output gradients (backward). A module is only charged with what
    it receives clean and passes on broken, so the worst list names where a problem starts.
    """
    empty = TensorStats()
    inputs, outputs = kinds.get("inputs", empty), kinds.get("outputs", empty)
    grads, output_grads = kinds.get("grads", empty), kinds.get("output_grads", empty)
    broken = [s for s, fed in ((outputs, inputs), (grads, output_grads)) if s.nonfinite and not fed.nonfinite]
    if broken:
        return ModuleIssue(name, "non-finite", sum(s.nonfinite for s in broken) / sum(s.count for s in broken))
    under = grads.share(FP16, "underflow")
    over = outputs.share(FP16, "overflow") if not (inputs.overflow["fp16"] or inputs.nonfinite) else 0.0
    if under <= 0 and over <= 0:
        return None
    return ModuleIssue(name, "underflow", under) if under >= over else ModuleIssue(name, "overflow", over)


def _problems(s: NumericsSample) -> list[str]:
    out: list[str] = []
    bad = [w for w in s.worst if w.issue == "non-finite"]
    if s.grad_nonfinite or s.act_nonfinite:
        where = f" (starting in {', '.join(_label(w.name) for w in bad)})" if bad else ""
        names = [repr(w.name) for w in bad if w.name]
        keep = f"Engine(keep_fp32=[{', '.join(names)}])" if names else "Engine(keep_fp32=[...])"
        hint = (
            f"the step is skipped; if it keeps happening the scale collapses: lower ScalerConfig(init_scale=...) or keep the "
            f"module in fp32 with {keep}"
            if s.scale is not None
            else f"check the loss and the inputs, or keep the module in fp32 with {keep}"
        )
        out.append(f"non-finite values: {s.grad_nonfinite} in gradients, {s.act_nonfinite or 0} in activations{where}; {hint}")
    if not s.fp16:
        return out
    head = s.headroom
    if head is not None and math.isfinite(head) and head < 0:
        out.append(
            f"scaled gradients reach {s.grad_max_abs:.3g}, above fp16's 65504 at scale {_scale_text(s.scale or 1.0)}: "
            f"use a loss scale of at most {_scale_text(s.suggested_scale or 1.0)}"
        )
    if s.grad_underflow_share > _FLUSH_WARN:
        under = [w for w in s.worst if w.issue == "underflow"]
        where = f", mostly in {', '.join(_label(w.name) for w in under)}" if under else ""
        sugg = s.suggested_scale
        if sugg is not None and sugg > (s.scale or 1.0):
            fix = f"raise the loss scale to {_scale_text(sugg)} (Engine(scaler=ScalerConfig(init_scale={sugg:g})) or a static scaler={sugg:g})"
        else:
            fix = "a larger scale would overflow the largest gradients: keep those modules in fp32 (Engine(keep_fp32=[...])) or train in bf16-mixed"
        out.append(f"{fmt_share(s.grad_underflow_share)} of gradient values fall below fp16's 2^-24 and flush to zero{where}: {fix}")
    over = [w for w in s.worst if w.issue == "overflow"]
    # Values above 65504 that fp32 holds (in a kept module, or passed on from one) broke nothing: had they
    # reached an fp16 op they would be inf, and non-finite values are reported above. Warn only where a
    # module outside keep_fp32 starts an overflow.
    if s.act_overflow and over:
        names = [repr(w.name) for w in over if w.name]
        where = f" in {', '.join(_label(w.name) for w in over)}" if over else ""
        keep = f"Engine(keep_fp32=[{', '.join(names)}])" if names else "Engine(keep_fp32=[...])"
        out.append(
            f"{s.act_overflow} activation values{where} exceed fp16's 65504 (inf in an fp16 forward): keep those modules in fp32 with "
            f"{keep}, normalise or rescale them, or train in bf16-mixed"
        )
    return out


def _contains(outer: str, inner: str) -> bool:
    """Whether module ``outer`` contains module ``inner`` (by name)."""
    return outer != inner and (outer == "" or inner.startswith(outer + "."))


def _scale_text(scale: float) -> str:
    mantissa, exponent = math.frexp(scale)
    return f"2^{exponent - 1}" if mantissa == 0.5 else f"{scale:.4g}"


def _label(name: str) -> str:
    return name or "(model)"
