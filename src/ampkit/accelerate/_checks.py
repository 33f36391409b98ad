"""What :class:`~ampkit.accelerate.AmpkitAccelerator` refuses, each named with what to drop or pass instead.

The engine brings the autocast, the loss scaler and the optimizer step; Accelerate has its own of each. Two of them at
once would train silently wrong (a second autocast is harmless, but a second scaler multiplies the loss twice and
skips on its own), so every setting that turns on Accelerate's is refused before anything is built:
``mixed_precision=`` other than ``"no"`` (from the argument or the launcher's ``ACCELERATE_MIXED_PRECISION``), a
``GradScalerKwargs`` or ``AutocastKwargs`` handler, and the strategies that carry their own mixed precision and
optimizer step (DeepSpeed, FSDP, Megatron-LM, tensor/context parallelism), which the engine does not drive here.

    >>> check_accelerate_kwargs("bf16-mixed", {"mixed_precision": "bf16"}, environ={})
    Traceback (most recent call last):
    ...
    ValueError: AmpkitAccelerator(precision='bf16-mixed', mixed_precision='bf16'): two mixed precisions at once (two autocasts; fp16 would also add a second loss scaler). Drop mixed_precision='bf16': the precision policy replaces it.
    >>> check_accelerate_kwargs("bf16-mixed", {"mixed_precision": "no", "gradient_accumulation_steps": 2}, environ={})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["SUPPORTED", "check_accelerate_kwargs", "check_distributed_type", "check_plain_model", "grad_scaler_kwargs_fix"]

SUPPORTED = "one device, or DDP (accelerate launch / torchrun with the default multi-GPU or multi-CPU setup)"
"""Where AmpkitAccelerator trains, in the words its refusals use."""

# The Accelerator arguments that turn on a strategy with its own mixed precision and optimizer step, and the launcher's
# environment variables that do the same.
_PLUGINS = ("deepspeed_plugin", "deepspeed_plugins", "fsdp_plugin", "megatron_lm_plugin", "torch_tp_plugin", "parallelism_config")
_PLUGIN_ENV = {"ACCELERATE_USE_DEEPSPEED": "DeepSpeed", "ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM",
               "ACCELERATE_USE_PARALLELISM_CONFIG": "a ParallelismConfig"}


def grad_scaler_kwargs_fix(handler: Any) -> str:
    """The ``scaler=`` that scales as a ``GradScalerKwargs`` asks (the engine's scaler replaces Accelerate's GradScaler).

    >>> from accelerate.utils import GradScalerKwargs
    >>> grad_scaler_kwargs_fix(GradScalerKwargs(init_scale=1024.0))
    'scaler=ampkit.ScalerConfig(init_scale=1024, growth_factor=2, backoff_factor=0.5, growth_interval=2000)'
    """
    if not getattr(handler, "enabled", True):
        return "scaler='none'"
    return (f"scaler=ampkit.ScalerConfig(init_scale={handler.init_scale:g}, growth_factor={handler.growth_factor:g}, "
            f"backoff_factor={handler.backoff_factor:g}, growth_interval={handler.growth_interval})")


def check_accelerate_kwargs(precision: Any, kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> None:
    """Refuse the ``Accelerator`` arguments (and launcher variables) that conflict with ampkit's ``precision``."""
    environ = os.environ if environ is None else environ
    call = f"AmpkitAccelerator(precision={precision!r}"
    mixed = kwargs.get("mixed_precision")
    if mixed is not None and str(mixed) != "no":
        raise ValueError(
            f"{call}, mixed_precision={str(mixed)!r}): two mixed precisions at once (two autocasts; fp16 would also add a second "
            f"loss scaler). Drop mixed_precision={str(mixed)!r}: the precision policy replaces it."
        )
    launched = environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if mixed is None and launched != "no":
        raise ValueError(
            f"{call}): the launcher set ACCELERATE_MIXED_PRECISION={launched} (accelerate launch --mixed_precision, or the "
            "accelerate config file), a second mixed precision beside the policy. Launch with --mixed_precision no (or "
            "unset the variable): the precision policy replaces it."
        )
    for name in _PLUGINS:
        if kwargs.get(name) is not None:
            raise ValueError(
                f"{call}, {name}=...): this strategy brings its own mixed precision and optimizer step, which the ampkit engine "
                f"does not drive. Drop {name}; AmpkitAccelerator trains on {SUPPORTED}. For FSDP, train with "
                "ampkit.Engine(precision, strategy='fsdp') in your own loop."
            )
    for variable, what in _PLUGIN_ENV.items():
        if environ.get(variable, "false").lower() == "true":
            raise ValueError(
                f"{call}): the launcher set {variable}=true ({what}), which brings its own mixed precision and optimizer step. "
                f"Launch without it: AmpkitAccelerator trains on {SUPPORTED}."
            )
    from accelerate.utils import AutocastKwargs, GradScalerKwargs

    for handler in kwargs.get("kwargs_handlers") or ():
        if isinstance(handler, GradScalerKwargs):
            raise ValueError(  # noqa: TRY004 - a setting that conflicts, as every refusal here (not a wrong type)
                f"{call}, kwargs_handlers=[GradScalerKwargs(...)]): the engine's loss scaler replaces Accelerate's GradScaler; "
                f"drop the handler and pass {grad_scaler_kwargs_fix(handler)}."
            )
        if isinstance(handler, AutocastKwargs):
            raise ValueError(  # noqa: TRY004 - the same
                f"{call}, kwargs_handlers=[AutocastKwargs(...)]): the policy's forward context replaces Accelerate's autocast; "
                "drop the handler (keep_fp32=[module names or types] runs modules in fp32)."
            )


def check_distributed_type(precision: Any, distributed_type: Any) -> None:
    """Refuse a strategy that reached the accelerator another way (a config file, a second Accelerator)."""
    name = getattr(distributed_type, "value", str(distributed_type))
    if name in ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA"):
        raise ValueError(
            f"AmpkitAccelerator(precision={precision!r}): Accelerate is set up for {name}, which brings its own mixed precision "
            f"and optimizer step; AmpkitAccelerator trains on {SUPPORTED}. Launch without {name}."
        )


def check_plain_model(model: nn.Module) -> None:
    """Refuse a model already wrapped for data parallelism: the policy casts the plain model, then Accelerate wraps it
    (DDP registers the parameters it was given; cast after, its buckets would hold the old ones).

    >>> check_plain_model(nn.DataParallel(nn.Linear(2, 2)))
    Traceback (most recent call last):
    ...
    ValueError: prepare() got a model already wrapped in DataParallel; pass the plain model (the nn.Module inside): AmpkitAccelerator applies the precision policy, then wraps it for DDP itself.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    wrappers: tuple[type, ...] = (DistributedDataParallel, nn.DataParallel, FSDPModule)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers += (FullyShardedDataParallel,)
    except ImportError:  # pragma: no cover - every torch ampkit supports has it
        pass
    if isinstance(model, wrappers):
        kind = next(w.__name__ for w in wrappers if isinstance(model, w))
        raise ValueError(  # noqa: TRY004 - as the engine's own "already wrapped" refusal
            f"prepare() got a model already wrapped in {kind}; pass the plain model (the nn.Module inside): AmpkitAccelerator "
            "applies the precision policy, then wraps it for DDP itself."
        )
