"""The numerics doctor: why a model breaks in fp16 or bf16, and the settings that fix it.

:func:`diagnose` trains a few steps in fp32 with a :class:`~ampkit.numerics._recorder.ModuleRecorder` on
every module (the reference), derives the loss scale the gradients allow (:mod:`~ampkit.numerics._scale`),
tailors each candidate policy by experiment (:mod:`~ampkit.numerics._recommend`) and compares one step under
the policy as it comes ("default") and as tailored ("recommended") with fp32 (:mod:`~ampkit.numerics._compare`).

    >>> from torch import nn
    >>> from ampkit import Engine
    >>> from ampkit.numerics import diagnose
    >>> torch.manual_seed(0); model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # doctest: +ELLIPSIS
    <...>
    >>> batches = [(torch.randn(32, 8), torch.randint(0, 3, (32,))) for _ in range(3)]
    >>> d = diagnose(model, batches, nn.functional.cross_entropy, steps=2, target="16-mixed")
    >>> d.recommended_precision, d.keep_fp32, d.recommended_loss_scale >= 2**16
    ('16-mixed', [], True)
    >>> engine = Engine(**d.engine_kwargs())   # the prescription, applied as is
    >>> d.engine_code()
    'Engine(precision="16-mixed", scaler=ScalerConfig(init_scale=262144.0))'
"""

from __future__ import annotations

import copy
import datetime
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._report.dialect import Advice, check_framework, paste_code
from .._util.model_io import batch_loss, default_loss, to_device
from .._util.units import fmt_share
from ..policy import Policy, get_policy
from ..training._compile import check_compile_plan, compile_plan
from ._compare import LossFn, StepComparison, compare_step, reference_step, seeded
from ._compiled import CompileCheck, check_compiled
from ._engine_code import engine_code
from ._formats import FP16
from ._fp8_headroom import RECIPES as FP8_RECIPES, Fp8Headroom, fp8_headroom
from ._recommend import Tailored, candidate_precisions, choose_precision, tailor
from ._recorder import ModuleRecorder
from ._scale import LossScaleAdvice, recommend_loss_scale
from ._severity import module_entries
from ._stats import TensorStats
from ._update_remedy import AUDITED_POLICY, UpdatePrecision, check_update_precision

__all__ = ["UPDATE_STEPS", "Diagnosis", "diagnose"]

UPDATE_STEPS = 8
"""Optimizer steps per policy in the update-precision check: enough for fp32 masters to carry updates of a
fraction of a bf16 gap across it, few enough to keep the doctor quick."""

Optimizer = Callable[[Any], torch.optim.Optimizer]


@dataclass
class Diagnosis:
    """What :func:`diagnose` found and recommends; :meth:`to_dict` is doctor.json."""

    recommended_precision: str
    precision_reasons: list[str]
    keep_fp32: list[str]
    scale: LossScaleAdvice
    """The fp16 loss scale the reference gradients allow (reported whatever the precision chosen)."""
    loss_scale_log2: int | None
    """The scale the engine should start from: the advice, lowered if tailoring had to; None without scaling."""
    weight_grads: TensorStats
    activation_grads: TensorStats
    comparisons: list[StepComparison]
    modules: list[dict[str, Any]]
    reference_steps: int
    tailoring_notes: list[str] = field(default_factory=list)
    target: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    """Run facts for the report: device, workload, command."""
    compile_check: CompileCheck | None = None
    """The recommended policy's step compiled against eager (``diagnose(compile=...)``); None when not asked."""
    update_precision: UpdatePrecision | None = None
    """Whether bf16 weights stepped directly lose updates and the remedy that recovers fp32's training
    (:mod:`~ampkit.numerics._update_remedy`); None without an optimizer or with ``update_steps=0``."""
    fp8: Fp8Headroom | None = None
    """How each Linear's input, weight and grad_output fit torchao's float8 cast (:mod:`~ampkit.numerics._fp8_headroom`);
    None with ``fp8_recipe=None``."""
    framework: str | None = None
    """The framework the model came from (``"lightning"``, ``"transformers"``; ``ampkit doctor`` sets it from the
    workload): the prescription is also printed in its terms (:meth:`framework_code`); None: plain PyTorch."""

    @property
    def recommended_loss_scale(self) -> float:
        """The fp16 loss scale to start from: ``2^k``, the largest keeping every gradient within 65504."""
        return 2.0 ** (self.loss_scale_log2 if self.loss_scale_log2 is not None else self.scale.log2)

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~ampkit.Engine` that apply the recommendation: ``Engine(**d.engine_kwargs())``."""
        from ..scaling import ScalerConfig

        kwargs: dict[str, Any] = {"precision": self.recommended_precision}
        if self.keep_fp32:
            kwargs["keep_fp32"] = list(self.keep_fp32)
        scaler = self._scaler_settings()
        if scaler is not None:
            kwargs["scaler"] = ScalerConfig(**scaler)
        return kwargs

    def _scaler_settings(self) -> dict[str, float] | None:
        if get_policy(self.recommended_precision).loss_scaling != "dynamic":
            return None
        init = self.recommended_loss_scale
        settings = {"init_scale": init}
        # ScalerConfig keeps the scale within [1, 2^24] by default; widen the bound the recommendation crosses.
        if init > 2.0**24:
            settings["max_scale"] = init
        if init < 1.0:
            settings["min_scale"] = init
        return settings

    def engine_code(self) -> str:
        """The Python line that builds the recommended engine: the one recommendation, printed as ``Paste:``."""
        return engine_code(self.recommended_precision, self.keep_fp32, self._scaler_settings())

    def advice(self) -> Advice:
        """The prescription as the configuration to recommend (:class:`ampkit._report.dialect.Advice`): the policy,
        the modules kept in fp32 and the scaler's settings, on the device the doctor ran on."""
        device = torch.device(str(self.context.get("device", "cpu"))).type
        return Advice(precision=self.recommended_precision, keep_fp32=tuple(self.keep_fp32), scaler=self._scaler_settings(), device=device)

    def framework_code(self) -> str | None:
        """The prescription as the lines to paste into a script of :attr:`framework` (``L.Trainer`` for Lightning,
        ``TrainingArguments`` and a ``Trainer`` for Hugging Face); None for plain PyTorch, whose line is
        :meth:`engine_code`."""
        return paste_code(self.advice(), self.framework) if check_framework(self.framework) is not None else None

    def _update_dict(self) -> dict[str, Any] | None:
        """doctor.json's ``update_precision``, with whether its prescription is the recommendation's (``applied``:
        the recommended policy steps bf16 weights) or an option beside it (the recommendation keeps fp32 weights)."""
        if self.update_precision is None:
            return None
        check = self.update_precision
        kwargs = check.engine_kwargs()
        code = engine_code(kwargs["precision"], kwargs.get("keep_fp32", ())) if kwargs else None
        applied = check.prescribed is not None and self.recommended_precision == check.prescribed and set(check.keep_fp32) <= set(self.keep_fp32)
        fp32_weights = get_policy(self.recommended_precision).param_dtype == torch.float32
        return {**check.to_dict(), "engine_code": code, "applied": applied, "recommendation_fp32_weights": fp32_weights}

    def to_dict(self) -> dict[str, Any]:
        """The doctor.json document (its keys are listed in :mod:`ampkit.numerics`)."""
        from .. import __version__

        weights_unscaled, acts_unscaled = self.weight_grads.underflow_share("fp16"), self.activation_grads.underflow_share("fp16")
        k = self.loss_scale_log2 if self.loss_scale_log2 is not None else self.scale.log2
        return {
            "ampkit": __version__, "torch": torch.__version__, **self.context, "reference_steps": self.reference_steps,
            "target": self.target, "recommended_precision": self.recommended_precision,
            "precision_reasons": list(self.precision_reasons), "recommended_loss_scale": self.recommended_loss_scale,
            "loss_scale_log2": k, "gradient_max_abs": self.scale.max_abs, "keep_fp32": list(self.keep_fp32),
            "engine": {"precision": self.recommended_precision, "keep_fp32": list(self.keep_fp32), "scaler": self._scaler_settings()},
            "engine_code": self.engine_code(),
            "framework": self.framework, "framework_code": self.framework_code(),
            "underflow_share_unscaled": self.scale.underflow_unscaled,
            "underflow_share_scaled": TensorStats.merge([self.weight_grads, self.activation_grads]).underflow_share("fp16", k),
            "gradient_underflow": {
                "weights": {"unscaled": weights_unscaled, "scaled": self.weight_grads.underflow_share("fp16", k)},
                "activations": {"unscaled": acts_unscaled, "scaled": self.activation_grads.underflow_share("fp16", k)},
            },
            "gradient_histograms": {
                "weights": self.weight_grads.to_dict()["histogram"], "activations": self.activation_grads.to_dict()["histogram"],
            },
            "tailoring_notes": list(self.tailoring_notes),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "compile_check": self.compile_check.to_dict() if self.compile_check is not None else None,
            "update_precision": self._update_dict(),
            "fp8_headroom": self.fp8.to_dict() if self.fp8 is not None else None,
            "modules": self.modules,
        }

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` to ``path`` atomically (a temporary file renamed into place)."""
        from ..fileio._checkpoint_files import write_text_atomic

        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")


def _reference_run(model: nn.Module, batches: Sequence[Any], loss_fn: LossFn, steps: int, optimizer: Optimizer | None, seed: int) -> ModuleRecorder:
    """``steps`` fp32 training steps of ``model`` itself with every module recorded."""
    opt = optimizer(model.parameters()) if optimizer is not None else None
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with seeded(seed, device), ModuleRecorder(model) as rec:
        for step in range(steps):
            loss = batch_loss(model, batches[step % len(batches)], loss_fn)
            if not torch.isfinite(loss.detach()):
                raise ValueError(
                    f"the fp32 loss is {float(loss.detach())} at reference step {step}: the model fails without any 16-bit "
                    "arithmetic, which no precision setting can fix; check the model and data first."
                )
            rec.backward_from(loss)  # its gradient is the seed, no value of the model's
            loss.backward()
            rec.record_parameters()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)
    return rec


def _gradient_totals(stats: dict[str, dict[str, TensorStats]], model: nn.Module) -> tuple[TensorStats, TensorStats]:
    """(all parameter gradients, all activation gradients). Activation gradients are taken at leaf modules only:
    a container's output is usually its last child's, and counting it twice would skew the shares."""
    leaves = {name for name, m in model.named_modules() if not any(True for _ in m.children())}
    weights = TensorStats.merge(s["grads"] for s in stats.values() if "grads" in s)
    acts = TensorStats.merge(s["output_grads"] for n, s in stats.items() if n in leaves and "output_grads" in s)
    return weights, acts


def _largest_gradient(stats: dict[str, dict[str, TensorStats]]) -> float:
    """The largest gradient of the backward, every module's output included: a container's own arithmetic (outside
    its children) can hand its output a larger gradient than any leaf sees, and the scale must keep that in range
    too, or the report would flag an overflow at the scale it recommends."""
    return max((s[kind].max_abs for s in stats.values() for kind in ("grads", "output_grads") if kind in s), default=0.0)


def diagnose(
    model: nn.Module,
    batches: Sequence[Any],
    loss_fn: LossFn = default_loss,
    *,
    steps: int = 3,
    target: str | Policy | None = None,
    optimizer: Optimizer | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    context: dict[str, Any] | None = None,
    compile: bool | str | dict[str, Any] | None = None,
    update_steps: int = UPDATE_STEPS,
    fp8_recipe: str | None = "tensorwise",
) -> Diagnosis:
    """Diagnose how ``model`` fits fp16/bf16 on ``batches`` and recommend a policy, fp32 modules and a loss scale.

    Args:
        model: the fp32 model (left untouched: the doctor trains a copy); a LightningModule (its ``training_step``
            is the loss) or a model ``accelerate.Accelerator.prepare()`` returned (its plain fp32 module) too.
        batches: ``(inputs, targets)`` pairs or dicts of model keyword arguments (targets: their ``labels``); step
            ``i`` uses ``batches[i % len(batches)]``, the comparison the next. A ``datasets.Dataset`` is collated
            into ``steps + 1`` batches of 8 rows.
        loss_fn: ``loss_fn(output, targets)``, given a tensor output in fp32; default: the output's ``.loss``, else
            cross-entropy or MSE by the targets' dtype (:func:`ampkit.bench._model_io.default_loss`).
        steps: fp32 reference steps whose statistics are collected (the optimizer steps between them).
        target: tailor for this policy only (a name, e.g. ``"16-mixed"`` for a GPU without bf16, or a Policy); default: choose among
            the mixed policies that run fast on ``device``.
        compile: also run the recommended policy's step compiled as ``Engine(compile=compile)`` would (True,
            ``"regional"`` or torch.compile options) and compare it with the eager step, module by module
            (:mod:`~ampkit.numerics._compiled`); default: no compiled step.
        optimizer: ``optimizer(params)`` for the reference steps; default: none (statistics of the initial weights).
        device: where to run; default: where the model's parameters are. The batches are moved there too, so a
            CPU model and CPU batches can be diagnosed on a GPU as they are.
        update_steps: with an ``optimizer``, train this many steps of ``bf16-true`` (updates audited) beside
            ``32-true`` from the initial weights and, if updates are lost, of each remedy, cheapest first
            (:mod:`~ampkit.numerics._update_remedy`); 0: no update-precision check.
        fp8_recipe: cast every Linear's operands of one fp32 step as this torchao float8 recipe would
            (``"tensorwise"`` or ``"rowwise"``) and report what flushes (:mod:`~ampkit.numerics._fp8_headroom`);
            None: no fp8 check.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (fp32 reference steps to collect statistics from), got {steps}.")
    from ..workloads._framework_inputs import tool_inputs  # deferred: the doctor's import stays that of its own parts

    # A prepared model unwrapped, a LightningModule's training_step as the loss, a Dataset collated (steps + 1 batches).
    model, batches, loss_fn = tool_inputs(model, batches, loss_fn, count=steps + 1, what="diagnose()")
    if not batches:
        raise ValueError("diagnose() needs at least one (inputs, targets) batch.")
    if fp8_recipe is not None and fp8_recipe not in FP8_RECIPES:
        raise ValueError(f"fp8_recipe={fp8_recipe!r} is not a torchao float8 recipe; pick one of {', '.join(FP8_RECIPES)}, or None for no fp8 check.")
    plan = compile_plan(compile)  # a compile setting that cannot apply is refused before the reference run, not after
    check_compile_plan([model], plan)
    work = copy.deepcopy(model).float()
    if device is not None:
        work = work.to(device)
    dev = next((p.device for p in work.parameters()), torch.device("cpu"))
    # The batches go where the model went (a no-op for tensors already there); their memory format is kept.
    batches = [to_device(b, dev) for b in batches]
    work.train()
    initial = copy.deepcopy(work) if optimizer is not None and update_steps > 0 else None  # before the reference run trains it
    rec = _reference_run(work, batches, loss_fn, steps, optimizer, seed)
    stats = rec.summaries()
    weight_grads, act_grads = _gradient_totals(stats, work)
    advice = recommend_loss_scale(TensorStats.merge([weight_grads, act_grads]), FP16, max_abs=_largest_gradient(stats))

    batch = batches[steps % len(batches)]  # a batch the statistics did not train on, from the trained weights
    ref = reference_step(work, batch, loss_fn, seed=seed)
    fp8 = fp8_headroom(work, batch, loss_fn, recipe=fp8_recipe, seed=seed) if fp8_recipe is not None else None
    if target is not None:
        candidates, reasons = [get_policy(target).name], [f"tailored for {get_policy(target).name}, as asked"]
        get_policy(target).check_device(dev)
    else:
        candidates, reasons = candidate_precisions(dev)
    defaults, tailored = [], []
    for name in candidates:
        policy = get_policy(name)
        default_scale = 2.0**16 if policy.loss_scaling == "dynamic" else None  # what Engine(precision=name) starts at
        defaults.append(compare_step(work, batch, loss_fn, name, reference=ref, loss_scale=default_scale, label="default"))
        tailored.append(tailor(work, batch, loss_fn, name, reference=ref, stats=stats, order=rec.order, loss_scale_log2=advice.log2))
    chosen = choose_precision(tailored)
    reasons += _reasons(chosen, tailored, advice)
    comparisons = [c for pair in zip(defaults, [t.comparison for t in tailored]) for c in pair]
    shown = [c for c in comparisons if chosen is None or c.policy == chosen.precision] or comparisons
    compiled = None
    if plan is not None:
        scale_log2 = chosen.loss_scale_log2 if chosen is not None else None
        compiled = check_compiled(
            work, batch, loss_fn, chosen.precision if chosen is not None else "32-true", reference=ref, compile=compile,
            keep_fp32=chosen.keep_fp32 if chosen is not None else (), loss_scale=2.0**scale_log2 if scale_log2 is not None else None,
        )
    updates = None
    if initial is not None:
        held = steps % len(batches)
        train = [b for i, b in enumerate(batches) if i != held] or batches
        updates = check_update_precision(initial, train, batch, loss_fn, optimizer, steps=update_steps, seed=seed)  # type: ignore[arg-type]
    precision, keep = (chosen.precision, list(chosen.keep_fp32)) if chosen is not None else ("32-true", [])
    if precision == AUDITED_POLICY and updates is not None:
        precision, keep = _with_update_remedy(precision, keep, updates, reasons)
    return Diagnosis(
        recommended_precision=precision,
        precision_reasons=reasons,
        keep_fp32=keep,
        scale=advice,
        loss_scale_log2=chosen.loss_scale_log2 if chosen is not None else None,
        weight_grads=weight_grads,
        activation_grads=act_grads,
        comparisons=shown,
        modules=module_entries(work, stats, rec.order, advice, shown, keep),
        reference_steps=steps,
        tailoring_notes=[n for t in tailored for n in (f"{t.precision}: {x}" for x in t.notes)],
        target=get_policy(target).name if target is not None else None,
        context={"device": str(dev), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **(context or {})},
        compile_check=compiled,
        update_precision=updates,
        fp8=fp8,
    )


def _with_update_remedy(precision: str, keep: list[str], updates: UpdatePrecision, reasons: list[str]) -> tuple[str, list[str]]:
    """The recommendation when it is the audited policy itself (bf16 weights stepped directly, asked for with
    ``target``): the update check's prescription joins it, so the doctor prints one engine line, not two."""
    if updates.prescribed is not None:
        kept = keep + [m for m in updates.keep_fp32 if m not in keep]
        what = f"{updates.prescribed}" + (f" with {', '.join(updates.keep_fp32)} in fp32" if updates.keep_fp32 else "")
        reasons.append(f"{precision} loses updates; {what} recovers fp32's training over {updates.steps} steps (update precision, below)")
        return updates.prescribed, kept
    if updates.lost:
        why = "no remedy tried recovers fp32's training" if updates.judged else "fp32's own loss did not fall enough to judge a remedy"
        reasons.append(f"{precision} loses updates and {why} (update precision, below): a policy with fp32 weights keeps them")
    return precision, keep


def _reasons(chosen: Tailored | None, tailored: Sequence[Tailored], advice: LossScaleAdvice) -> list[str]:
    out = []
    if chosen is None:
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
