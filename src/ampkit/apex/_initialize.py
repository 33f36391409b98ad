"""``amp.initialize``: check the call, resolve the opt level, convert the models, patch the optimizers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..policy._masters import MasterWeights
from ..training._kernel_guards import guard_optimizer
from ._casts import autocast_forward, is_autocast_forward
from ._convert import cast_io, convert_model, has_amp_io, modules_to_convert
from ._handle import AmpHandle
from ._properties import (
    check_opt_level,
    describe,
    resolve_half_dtype,
    resolve_properties,
)
from ._session import AmpSession
from ._state import _amp_state

__all__ = ["initialize"]

_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def _is_optimizer(obj: Any) -> bool:
    # LARC wraps an optimizer without subclassing Optimizer; Apex accepted it here too.
    return isinstance(obj, torch.optim.Optimizer) or type(obj).__name__ == "LARC" and hasattr(obj, "param_groups")


def _as_list(what: str, value: Any, ok: Any) -> tuple[list[Any], bool]:
    if isinstance(value, tuple):
        raise TypeError(f"{what} must be a single {'model' if what == 'models' else 'optimizer'} or a list; got a tuple. Pass a list: amp.initialize([...], ...).")
    items, was_list = (value, True) if isinstance(value, list) else ([value], False)
    bad = [type(v).__name__ for v in items if not ok(v)]
    if bad or not items:
        kind = "torch.nn.Module" if what == "models" else "torch.optim.Optimizer"
        raise TypeError(f"amp.initialize() takes {what} as a {kind} or a list of them; got {bad or 'an empty list'}.")
    return list(items), was_list


def _check_models(models: list[nn.Module], allow_not_fp32: bool) -> None:
    for m in models:
        if isinstance(m, _WRAPPERS):
            raise RuntimeError(  # noqa: TRY004 - a call-order mistake (wrapped before initialize), not a bad type
                f"This model is already wrapped in {type(m).__name__}. Call amp.initialize on the bare model and wrap "
                "the model it returns: model, optimizer = amp.initialize(model, optimizer, ...); model = DDP(model)."
            )
        if is_autocast_forward(m) or has_amp_io(m):
            raise RuntimeError("This model has already been through amp.initialize; call it once per model.")
        for name, p in m.named_parameters():
            if p.is_floating_point() and p.dtype != torch.float32 and not allow_not_fp32:
                raise RuntimeError(
                    f"Parameter {name!r} is {p.dtype}, expected torch.float32. Build the model in fp32 and let "
                    "amp.initialize cast it (drop the .half() / .to(dtype) call), or, where the 16-bit parameter is "
                    "intended, set amp._amp_state.allow_incoming_model_not_fp32 = True before initialize."
                )


def _check_optimizers(optimizers: list[Any]) -> None:
    for opt in optimizers:
        if hasattr(opt, "_amp_stash"):
            raise RuntimeError(
                "This optimizer has already been through amp.initialize; pass each optimizer once. To start over, "
                "build a new optimizer on the fp32 model."
            )


def _shape(models: list[Any], was_list: bool, optimizers: list[Any], opts_given: bool, opts_was_list: bool) -> Any:
    model_out = models if was_list else models[0]
    if not opts_given:
        return model_out
    return model_out, (optimizers if opts_was_list else optimizers[0])


def initialize(
    models: Any,
    optimizers: Any = None,
    enabled: bool = True,
    opt_level: str = "O1",
    cast_model_type: torch.dtype | None = None,
    patch_torch_functions: bool | None = None,
    keep_batchnorm_fp32: bool | str | None = None,
    master_weights: bool | None = None,
    loss_scale: float | str | None = None,
    cast_model_outputs: torch.dtype | None = None,
    num_losses: int = 1,
    verbosity: int = 1,
    min_loss_scale: float | None = None,
    max_loss_scale: float = 2.0**24,
    *,
    half_dtype: torch.dtype | str | None = None,
) -> Any:
    """Apex's ``amp.initialize`` on native torch: returns the model(s) and optimizer(s), shaped as passed.

    ``half_dtype`` (ampkit only) picks the 16-bit type of O1-O3; default: $AMPKIT_APEX_HALF_DTYPE, else fp16
    on CUDA and bfloat16 on CPU. ``cast_model_type`` still overrides the model's type under O2/O3.

    >>> model = nn.Linear(4, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> model, opt = initialize(model, opt, opt_level="O2", verbosity=0)
    >>> model.weight.dtype, opt.param_groups[0]["params"][0].dtype
    (torch.bfloat16, torch.float32)
    """
    if not isinstance(enabled, bool):
        if isinstance(enabled, str):
            raise TypeError(
                f"amp.initialize() got {enabled!r} as its third positional argument, which is `enabled`, not `opt_level` "
                f"(the signature is initialize(models, optimizers=None, enabled=True, opt_level='O1', ...)). "
                f"Pass it by keyword: amp.initialize(model, optimizer, opt_level={enabled!r})."
            )
        raise TypeError(f"enabled must be True or False, got {enabled!r}.")
    model_list, models_was_list = _as_list("models", models, lambda m: isinstance(m, nn.Module))
    opts_given = optimizers is not None
    opt_list, opts_was_list = _as_list("optimizers", optimizers, _is_optimizer) if opts_given else ([], False)
    if isinstance(num_losses, bool) or not isinstance(num_losses, int) or num_losses < 1:
        raise ValueError(f"num_losses must be an int >= 1 (one loss scaler per loss), got {num_losses!r}.")
    if cast_model_outputs is not None and not (isinstance(cast_model_outputs, torch.dtype) and cast_model_outputs.is_floating_point):
        raise ValueError(f"cast_model_outputs must be a floating torch.dtype such as torch.float32, got {cast_model_outputs!r}.")
    if not enabled:
        _amp_state.session, _amp_state.disabled = None, True
        return (models, optimizers) if opts_given else models

    opt_level = check_opt_level(opt_level)
    _check_models(model_list, _amp_state.allow_incoming_model_not_fp32)
    _check_optimizers(opt_list)
    first = next((p for m in model_list for p in m.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    half = resolve_half_dtype(device.type, half_dtype)
    overrides = {
        k: v
        for k, v in {
            "cast_model_type": cast_model_type,
            "patch_torch_functions": patch_torch_functions,
            "keep_batchnorm_fp32": keep_batchnorm_fp32,
            "master_weights": master_weights,
            "loss_scale": loss_scale,
        }.items()
        if v is not None
    }
    props = resolve_properties(opt_level, half, overrides)
    if min_loss_scale is not None and not (0 < min_loss_scale <= max_loss_scale):
        raise ValueError(f"need 0 < min_loss_scale <= max_loss_scale, got min_loss_scale={min_loss_scale}, max_loss_scale={max_loss_scale}.")
    session = AmpSession(props, device, num_losses, min_loss_scale, float(max_loss_scale), verbosity)
    for line in describe(opt_level, resolve_properties(opt_level, half, {}), props):
        session.say(line)
    uses_half = props.patch_torch_functions or props.cast_model_type in (torch.float16, torch.bfloat16)
    if device.type == "cpu" and uses_half:
        session.say(
            f"ampkit: on CPU the 16-bit type is {half} (fp16 on CPU runs ~20x slower than fp32); "
            f"pass half_dtype= or set AMPKIT_APEX_HALF_DTYPE to choose."
        )

    # Names: global ones for messages and amp.state_dict (prefixed by the model's index when there are
    # several), and each parameter's name inside its own model for that model's state_dict hooks.
    named: list[tuple[str, nn.Parameter]] = []
    for i, m in enumerate(model_list):
        for n, p in m.named_parameters():
            named.append((f"{i}.{n}" if len(model_list) > 1 else n, p))
            session.param_owner[id(p)] = (id(m), n)
    session.param_names = {id(p): n for n, p in named}

    dtype = props.cast_model_type
    keep_bn = bool(props.keep_batchnorm_fp32)
    output_dtype = cast_model_outputs if cast_model_outputs is not None else torch.float32
    if dtype is not None:
        converted = {id(p) for m in model_list for c in modules_to_convert(m, keep_bn)[0] for p in c.parameters(recurse=False) if p.is_floating_point()}
        session.converted_ids = converted if dtype != torch.float32 else set()
    masters_of: dict[int, MasterWeights | None] = {id(o): None for o in opt_list}
    if dtype in (torch.float16, torch.bfloat16) and props.master_weights:
        # Masters are cloned from the fp32 values before the model is cast down, so nothing is lost.
        for opt in opt_list:
            mw = MasterWeights.clone([(n, p) for n, p in named if id(p) in session.converted_ids], [opt])
            if len(mw):
                masters_of[id(opt)] = mw
                for p, master in zip(mw.model_params, mw.masters):
                    session.register_master(p, master)
                    session.param_names[id(master)] = session.param_names[id(p)]
    handle = AmpHandle(props.loss_scale, verbose=verbosity == 2) if props.patch_torch_functions else None
    for m in model_list:
        if dtype is not None:
            convert_model(m, dtype, keep_bn, device.type)
            cast_io(m, dtype, output_dtype)
            session.attach_model_hooks(m)
        if props.patch_torch_functions:
            # Outputs leave in fp32 (unless cast_model_outputs says otherwise): the loss is usually computed
            # outside the model, where no casts apply, and must not run in 16 bits.
            autocast_forward(m, device.type, half, output_dtype, handle.is_active)
        elif dtype is None and cast_model_outputs is not None:
            cast_io(m, None, cast_model_outputs)
    for opt in opt_list:
        # The parameters' dtypes are final only now (O3 casts them): see ampkit.training._kernel_guards. LARC wraps one.
        guard_optimizer(opt if isinstance(opt, torch.optim.Optimizer) else opt.optim)
        session.adopt_optimizer(opt, masters_of[id(opt)])
    _amp_state.session, _amp_state.disabled = session, False
    if handle is not None:
        _amp_state.handle = handle  # Apex's O1 left its handle here; scripts and its tests read it
    return _shape(model_list, models_was_list, opt_list, opts_given, opts_was_list)
