"""Checks and builders for what :class:`~ampkit.training.Engine`'s arguments name.

Each error says what was passed and what to pass instead; they run in the constructor and in ``setup()``, before
anything is changed.

    >>> check_accumulate(0)
    Traceback (most recent call last):
    ...
    ValueError: accumulate must be an int >= 1 (micro-batches per optimizer step), got 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..policy import Policy
from ..scaling import DynamicLossScaler, ScalerConfig, StaticLossScaler
from ..scaling._protocol import StepScaler
from ._optimizer_step import StepSettings
from ._step_records import NonFiniteReport

if TYPE_CHECKING:  # at run time only when asked for: importing ampkit.numerics loads the whole doctor
    from ..numerics._sampler import NumericsSampler

__all__ = [
    "adopt_schedulers", "build_sampler", "build_scaler", "check_accumulate", "check_loss", "check_optimizer_params", "check_setup_args",
    "step_settings",
]


def check_accumulate(accumulate: Any) -> int:
    """``accumulate`` when it is an int >= 1; else the error naming what it means."""
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an int >= 1 (micro-batches per optimizer step), got {accumulate!r}.")
    return accumulate


def step_settings(clip_grad_norm: Any, clip_grad_value: Any, skip_nonfinite: bool | str | None, *, scaled: bool) -> StepSettings:
    """What the optimizer step does besides stepping; refuses what cannot work.

    ``skip_nonfinite``: None (the default) skips a step whose loss or gradients are not finite under every policy;
    with a loss scaler (``scaled``) that is an overflow, part of the scaler's work, and stays quiet; without one it
    is a fault, and a WARNING names the step (each of the first three, then the 4th, 8th, 16th...). ``"raise"``: raise FloatingPointError instead
    (the step is skipped first, so the weights stay finite). ``False``: no check (refused with a loss scaler).

    >>> step_settings(1.0, None, None, scaled=True)
    StepSettings(clip_grad_norm=1.0, clip_grad_value=None, skip_nonfinite=True, on_nonfinite='quiet', skip_asked=True)
    >>> step_settings(None, None, None, scaled=False).on_nonfinite
    'warn'
    >>> step_settings(True, None, None, scaled=False)
    Traceback (most recent call last):
    ...
    ValueError: clip_grad_norm=True is not a number: pass the total gradient norm to clip to, e.g. clip_grad_norm=1.0.
    """
    for arg, value in (("clip_grad_norm", clip_grad_norm), ("clip_grad_value", clip_grad_value)):
        if isinstance(value, bool):  # an int to Python: True would clip to 1.0 without a word
            what = "the total gradient norm to clip to" if arg == "clip_grad_norm" else "the absolute value to clamp each gradient to"
            raise ValueError(f"{arg}={value} is not a number: pass {what}, e.g. {arg}=1.0.")  # noqa: TRY004 - a ValueError, as for every Engine argument
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{arg} must be a positive number or None, got {value!r}.")
    if clip_grad_norm is not None and clip_grad_value is not None:
        raise ValueError("Pass clip_grad_norm or clip_grad_value, not both.")
    if skip_nonfinite not in (None, True, False, "raise"):
        raise ValueError(f"skip_nonfinite={skip_nonfinite!r} is not understood; pass True or None (skip such steps, the default), "
                         "'raise' (stop the run at the first) or False (no check).")
    if scaled and skip_nonfinite is False:
        raise ValueError("A scaled loss must skip steps whose gradients overflowed; drop skip_nonfinite=False or pass scaler='none'.")
    if scaled and skip_nonfinite == "raise":
        raise ValueError(
            "skip_nonfinite='raise' with a loss scaler would stop the run at its first overflow, which the scaler meets and "
            "answers by lowering the scale as part of its work; a scale that collapses already raises (ScalerConfig's "
            "on_collapse). Drop skip_nonfinite='raise', or pass scaler='none' (bf16) to stop at the first non-finite step."
        )
    if skip_nonfinite is False:
        return StepSettings(clip_grad_norm, clip_grad_value, skip_nonfinite=False)
    report: NonFiniteReport = "raise" if skip_nonfinite == "raise" else "quiet" if scaled else "warn"
    return StepSettings(clip_grad_norm, clip_grad_value, skip_nonfinite=True, on_nonfinite=report, skip_asked=scaled or skip_nonfinite is not None)


def check_setup_args(models: Any, optimizers: Sequence[Any]) -> list[nn.Module]:
    """The models setup() was given, as a list; refuses what is not a module or an optimizer."""
    model_list = [models] if isinstance(models, nn.Module) else list(models) if isinstance(models, (list, tuple)) else []
    if not model_list or not all(isinstance(m, nn.Module) for m in model_list):
        raise TypeError(f"setup() takes an nn.Module (or a list of them) first, got {type(models).__name__}.")
    for opt in optimizers:
        if isinstance(opt, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
            raise TypeError(
                f"setup() got the LR scheduler {type(opt).__name__} among the optimizers: pass it by name, "
                "engine.setup(model, optimizer, schedulers=scheduler), and the engine steps it after each real (not skipped) step."
            )
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"setup() takes torch.optim.Optimizer instances after the model, got {type(opt).__name__}.")
    return model_list


def check_loss(loss: torch.Tensor, kwargs: dict[str, Any]) -> None:
    """Refuse a loss ``engine.backward()`` cannot train on, naming the cause, where torch would say only "element 0 of
    tensors does not require grad". Two attribute reads: no sync, nothing per parameter.

    >>> check_loss(torch.ones(3, requires_grad=True), {})
    Traceback (most recent call last):
    ...
    ValueError: engine.backward() takes the scalar loss, got a tensor of shape (3,): reduce it first (loss.mean(), or the loss function's reduction='mean'); the engine divides one number by the window's size and scales it. To back-propagate a non-scalar tensor on purpose, pass its gradient: engine.backward(out, gradient=...).
    """
    if not loss.requires_grad:
        if not torch.is_grad_enabled():
            cause = "engine.backward() is called inside torch.no_grad() (or inference_mode), where the loss was computed too: compute the loss outside it"
        elif loss.is_inference():
            cause = "it was computed under torch.inference_mode(): compute the training loss outside it"
        else:
            cause = ("it was detached from the model (.detach(), .item() or torch.tensor(value) of it, or computed under torch.no_grad()), or "
                     "none of the parameters it comes from requires grad: pass the loss tensor the model's output gives, as computed")
        raise ValueError(f"engine.backward() got a loss that does not require grad, so no gradient can reach the model: {cause}.")
    if loss.dim() != 0 and "gradient" not in kwargs:
        raise ValueError(
            f"engine.backward() takes the scalar loss, got a tensor of shape {tuple(loss.shape)}: reduce it first (loss.mean(), or the "
            "loss function's reduction='mean'); the engine divides one number by the window's size and scales it. To back-propagate "
            "a non-scalar tensor on purpose, pass its gradient: engine.backward(out, gradient=...)."
        )


def build_scaler(spec: Any, policy: Policy) -> StepScaler | None:
    """The loss scaler ``scaler=`` names (default: the policy's), or None without scaling.

    >>> from ampkit.policy import get_policy
    >>> type(build_scaler(None, get_policy("16-mixed"))).__name__, build_scaler("none", get_policy("16-mixed"))
    ('DynamicLossScaler', None)
    """
    if spec is None:
        return policy.default_scaler()
    if isinstance(spec, torch.amp.GradScaler):
        raise ValueError(_grad_scaler_fix(spec))  # noqa: TRY004 - a ValueError, as for every Engine argument that cannot work
    if isinstance(spec, StepScaler):
        return spec
    if isinstance(spec, ScalerConfig):
        return DynamicLossScaler(spec)
    if isinstance(spec, bool) or not isinstance(spec, (str, int, float)):
        raise ValueError(f"scaler={spec!r} is not understood; pass 'dynamic', 'none', a float (static scale), a ScalerConfig or a LossScaler.")  # noqa: TRY004
    if isinstance(spec, (int, float)):
        return StaticLossScaler(float(spec))
    if spec == "dynamic":
        return DynamicLossScaler()
    if spec == "none":
        return None
    raise ValueError(f"scaler={spec!r} is not understood; pass 'dynamic', 'none', a float (static scale), a ScalerConfig or a LossScaler.")


def _grad_scaler_fix(scaler: torch.amp.GradScaler) -> str:
    """Why a GradScaler cannot be the engine's scaler, and the ScalerConfig that scales as it does."""
    if not scaler.is_enabled():
        return "scaler=torch.amp.GradScaler(enabled=False) scales nothing: pass scaler='none'."
    config = (f"ScalerConfig(init_scale={scaler.get_scale():g}, growth_factor={scaler.get_growth_factor():g}, "
              f"backoff_factor={scaler.get_backoff_factor():g}, growth_interval={scaler.get_growth_interval()})")
    return (f"scaler=torch.amp.GradScaler(...): the engine unscales, checks and skips every optimizer of a step at once, which "
            f"GradScaler's per-optimizer step() cannot; pass scaler=ampkit.{config}, its rules on the device (plus a floor and a "
            "ceiling, see ScalerConfig), and drop the GradScaler's scale(), step() and update() calls: engine.backward() and "
            "engine.step() make them.")


def build_sampler(spec: Any) -> NumericsSampler | None:
    """The numerics sampler ``numerics=`` names; imported only when asked for (it is a tool, above this layer)."""
    if spec is None:
        return None
    from ..numerics._sampler import NumericsSampler

    if isinstance(spec, NumericsSampler):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        return NumericsSampler(every=spec)
    raise TypeError(f"numerics={spec!r} is not understood; pass an int N (sample every N optimizer steps), a NumericsSampler or None.")


def adopt_schedulers(schedulers: Any, optimizers: Sequence[torch.optim.Optimizer]) -> list[Any]:
    """The LR schedulers setup() steps on real (not skipped) steps; each must be built on one of ``optimizers``."""
    if schedulers is None:
        return []
    scheds = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
    for s in scheds:
        if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise TypeError("ReduceLROnPlateau needs a metric: step it yourself, guarded by `not engine.step_was_skipped`.")
        if not hasattr(s, "step") or getattr(s, "optimizer", None) not in optimizers:
            raise ValueError("Each scheduler must be an LR scheduler built on one of the optimizers passed to setup().")
    return scheds


def check_optimizer_params(optimizers: Sequence[torch.optim.Optimizer], ours: set[int]) -> None:
    """Refuse an optimizer holding a parameter that is not the models': setup() would prepare (cast, unscale,
    check) the models' parameters while that optimizer steps another one, so the model would not train as asked,
    and engine.save() would not hold that parameter's value (the optimizer saves only its state), so a resumed
    run would silently lose it. A model parameter in no optimizer is fine: a frozen layer."""
    for i, opt in enumerate(optimizers):
        where = [(g, j, p) for g, group in enumerate(opt.param_groups) for j, p in enumerate(group["params"]) if id(p) not in ours]
        if not where:
            continue
        name = f"optimizer {i} ({type(opt).__name__})"
        total = sum(len(group["params"]) for group in opt.param_groups)
        if len(where) == total:
            raise ValueError(
                f"setup(): {name} holds none of the model's parameters, so it would train nothing here; build it on "
                f"this model's parameters, e.g. {type(opt).__name__}(model.parameters(), ...)."
            )
        g, j, p = where[0]
        raise ValueError(
            f"setup(): {name} holds {len(where)} parameter(s) that are not in the model(s) given to setup(), the first "
            f"param_groups[{g}]['params'][{j}] ({p.dtype} tensor of shape {tuple(p.shape)}), which neither the precision policy "
            "nor engine.save() would cover; pass every module it trains "
            "to setup(), e.g. setup([model, other], optimizer), or build it on the model's parameters only."
        )
