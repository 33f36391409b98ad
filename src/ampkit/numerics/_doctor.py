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
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._report.progress import Reporter
from .._util.model_io import batch_loss, default_loss, to_device
from ..policy import Policy, get_policy
from ..training._compile import check_compile_plan, compile_plan
from ._compare import LossFn, compare_step, reference_step, seeded
from ._compiled import check_compiled
from ._diagnosis import Diagnosis
from ._formats import FP16
from ._fp8_headroom import RECIPES as FP8_RECIPES, fp8_headroom
from ._keep_types import collapse_to_types
from ._paste import PasteCheck, settle_paste
from ._reasons import recommendation_reasons, with_update_remedy
from ._recommend import Tailored, candidate_precisions, choose_precision, tailor
from ._recorder import ModuleRecorder
from ._scale import recommend_loss_scale
from ._severity import module_entries
from ._stats import TensorStats
from ._train_check import TrainingJudge
from ._update_remedy import AUDITED_POLICY, UpdatePrecision, check_update_precision

__all__ = ["UPDATE_STEPS", "Diagnosis", "Progress", "diagnose"]

UPDATE_STEPS = 8
"""Optimizer steps per policy in the update-precision check: enough for fp32 masters to carry updates of a
fraction of a bf16 gap across it, few enough to keep the doctor quick."""

Optimizer = Callable[[Any], torch.optim.Optimizer]


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
    progress: Progress | None = None,
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
        progress: told each phase as it starts (``start(total)``, ``update(description, advance)``, ``finish()``,
            as :class:`ampkit.bench._progress.RichReporter` takes them: ``ampkit doctor`` passes a bar or a line per
            phase); default: nothing is told.
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
    phase = _Phases(progress, steps + len(get_policy_names(target, dev)) + 1 + (plan is not None) + (initial is not None))
    phase(f"fp32 reference: {steps} steps", units=steps)
    rec = _reference_run(work, batches, loss_fn, steps, optimizer, seed)
    stats = rec.summaries()
    weight_grads, act_grads = _gradient_totals(stats, work)
    advice = recommend_loss_scale(TensorStats.merge([weight_grads, act_grads]), FP16, max_abs=_largest_gradient(stats))

    batch = batches[steps % len(batches)]  # a batch the statistics did not train on, from the trained weights
    ref = reference_step(work, batch, loss_fn, seed=seed)
    if fp8_recipe is not None:
        phase("fp8 headroom")
    fp8 = fp8_headroom(work, batch, loss_fn, recipe=fp8_recipe, seed=seed) if fp8_recipe is not None else None
    if target is not None:
        candidates, reasons = [get_policy(target).name], [f"tailored for {get_policy(target).name}, as asked"]
        get_policy(target).check_device(dev)
    else:
        candidates, reasons = candidate_precisions(dev)
    defaults, tailored = [], []

    def tailor_for(name: str) -> Tailored:
        return tailor(work, batch, loss_fn, name, reference=ref, stats=stats, order=rec.order, loss_scale_log2=advice.log2)

    for name in candidates:
        phase(f"{name}: tailoring", units=1)
        policy = get_policy(name)
        default_scale = 2.0**16 if policy.loss_scaling == "dynamic" else None  # what Engine(precision=name) starts at
        defaults.append(compare_step(work, batch, loss_fn, name, reference=ref, loss_scale=default_scale, label="default"))
        tailored.append(tailor_for(name))
    held = steps % len(batches)
    train = [b for i, b in enumerate(batches) if i != held] or batches
    judge: list[TrainingJudge] = []  # built once, on the first need: fp32's control run of update_steps steps

    def make_judge() -> TrainingJudge:
        if not judge:
            judge.append(TrainingJudge(initial, train, batch, loss_fn, optimizer, steps=update_steps, seed=seed))  # type: ignore[arg-type]
        return judge[0]

    # The paste is never a configuration the report says still diverges: trained against fp32 first, else replaced.
    phase("checking the paste", units=1)
    chosen, extra, paste = settle_paste(choose_precision(tailored), tailored, tailor_fn=tailor_for, make_judge=make_judge if initial is not None else None, device=dev)
    tailored += extra
    reasons += recommendation_reasons(chosen, tailored, advice) + (paste.notes if paste is not None else [])
    for t in tailored:
        if chosen is None or t is not chosen:
            t.comparison.label = "tailored"  # the step as tailored, not what is recommended
    comparisons = [c for pair in zip(defaults, [t.comparison for t in tailored]) for c in pair] + [t.comparison for t in extra]
    shown = [c for c in comparisons if chosen is None or c.policy in (chosen.precision, paste.asked if paste is not None else None)] or comparisons
    compiled = None
    if plan is not None:
        phase("compiled step", units=1)
        scale_log2 = chosen.loss_scale_log2 if chosen is not None else None
        compiled = check_compiled(
            work, batch, loss_fn, chosen.precision if chosen is not None else "32-true", reference=ref, compile=compile,
            keep_fp32=chosen.keep_fp32 if chosen is not None else (), loss_scale=2.0**scale_log2 if scale_log2 is not None else None,
        )
    updates = None
    if initial is not None:
        phase("update precision", units=1)
        updates = _update_check(initial, train, batch, loss_fn, optimizer, update_steps, seed, tailored, tailor_for, paste, dev)  # type: ignore[arg-type]
    precision, keep = (chosen.precision, list(chosen.keep_fp32)) if chosen is not None else ("32-true", [])
    if precision == AUDITED_POLICY and updates is not None:
        precision, keep = with_update_remedy(precision, keep, updates, reasons)
    phase.done()
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
        paste_check=paste,
        keep_fp32_paste=collapse_to_types(work, keep),
        tailoring_notes=[n for t in tailored for n in (f"{t.precision}: {x}" for x in t.notes)],
        target=get_policy(target).name if target is not None else None,
        context={"device": str(dev), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **(context or {})},
        compile_check=compiled,
        update_precision=updates,
        fp8=fp8,
    )


def _update_check(
    initial: nn.Module, train: Sequence[Any], held_out: Any, loss_fn: LossFn, optimizer: Optimizer, steps: int, seed: int,
    tailored: list[Tailored], tailor_for: Callable[[str], Tailored], paste: PasteCheck | None, device: torch.device,
) -> UpdatePrecision:
    """The update-precision check with the forward fixes applied: ``bf16-true`` as the doctor tailors it (its modules
    kept in fp32), so a fault of the forward pass is not taken for lost updates; where ``bf16-true`` still diverges
    with them (and did not train when the paste was checked), the check names it a forward fault and tries no remedy."""
    fixes = next((t for t in tailored if t.precision == AUDITED_POLICY), None)
    if fixes is None and get_policy(AUDITED_POLICY).support(device).supported:
        fixes = tailor_for(AUDITED_POLICY)
    trained = paste is not None and any(t.precision == AUDITED_POLICY and t.trains for t in paste.trials)
    fault: list[str] = []
    if fixes is not None and not fixes.agrees and not trained:
        fault = list(fixes.comparison.diverging) or [fixes.comparison.forward_origin or "(the step goes non-finite)"]
    keep = fixes.keep_fp32 if fixes is not None else []
    return check_update_precision(initial, train, held_out, loss_fn, optimizer, steps=steps, seed=seed, keep_fp32=keep, forward_fault=fault)


Progress = Reporter  # what diagnose() tells of its phases: the tools' shared protocol


class _Phases:
    """Tells ``progress`` each phase as it starts, with the units of work the previous phase did."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self._progress, self._pending = progress, 0
        if progress is not None:
            progress.start(total)

    def __call__(self, description: str, units: int = 0) -> None:
        if self._progress is not None:
            self._progress.update(description, advance=self._pending)
        self._pending = units

    def done(self) -> None:
        self("done")
        if self._progress is not None:
            self._progress.finish()


def get_policy_names(target: str | Policy | None, device: torch.device) -> list[str]:
    """The policies the doctor tailors: ``target``'s name, or the fast mixed ones on ``device``."""
    return [get_policy(target).name] if target is not None else candidate_precisions(device)[0]
