"""The ``TrainingArguments`` and models an :class:`~ampkit.transformers.AmpkitTrainer` refuses, naming what to drop.

The Trainer's own mixed precision goes through Accelerate: ``bf16=True`` / ``fp16=True`` turn on its autocast, and
``fp16=True`` its GradScaler too. Beside an ampkit policy that is two autocasts and, for fp16, two loss scalers, each
scaling the loss and skipping on its own; so they are refused, as are the launcher's ``ACCELERATE_MIXED_PRECISION``
(which ``TrainingArguments`` reads), ``fp16_full_eval``/``bf16_full_eval`` (they cast the whole model for
``evaluate()``, behind the policy's back), and DeepSpeed and FSDP, which bring their own mixed precision and
optimizer step. A model already wrapped for data parallelism is refused as well: the policy casts the plain model,
then Accelerate wraps it.

    >>> from types import SimpleNamespace
    >>> check_training_args("bf16-mixed", SimpleNamespace(fp16=False, bf16=True))
    Traceback (most recent call last):
    ...
    ValueError: AmpkitTrainer(precision='bf16-mixed') with TrainingArguments(bf16=True): two autocasts at once. Drop bf16=True: the precision policy replaces it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_training_args"]


def check_training_args(precision: str, args: Any) -> None:
    """Refuse the settings of ``args`` (a ``TrainingArguments``) that conflict with the policy ``precision``."""
    who = f"AmpkitTrainer(precision={precision!r})"
    for flag in ("fp16", "bf16"):
        if getattr(args, flag, False):
            extra = " and two loss scalers (the Trainer's GradScaler and the engine's)" if flag == "fp16" else ""
            raise ValueError(f"{who} with TrainingArguments({flag}=True): two autocasts at once{extra}. Drop {flag}=True: the precision "
                             "policy replaces it.")
    mixed = getattr(args, "mixed_precision", "no")
    if mixed not in (None, "no"):
        raise ValueError(f"{who}: TrainingArguments read ACCELERATE_MIXED_PRECISION={mixed} from the environment (accelerate launch "
                         "--mixed_precision, or the accelerate config file), a second mixed precision beside the policy. Launch with "
                         "--mixed_precision no (or unset the variable).")
    for flag in ("fp16_full_eval", "bf16_full_eval"):
        if getattr(args, flag, False):
            raise ValueError(f"{who} with TrainingArguments({flag}=True): it casts the whole model to 16 bits for evaluate() outside "
                             "train(), behind the policy's back. Drop it: evaluation runs in the policy's forward context.")
    if getattr(args, "deepspeed", None):
        raise ValueError(f"{who} with TrainingArguments(deepspeed=...): DeepSpeed brings its own mixed precision, loss scaler and "
                         "optimizer step, which the ampkit engine does not drive. Drop deepspeed=; AmpkitTrainer trains on one device "
                         "or under DDP (torchrun).")
    if getattr(args, "fsdp", None) or getattr(args, "fsdp_plugin_args", None) is not None:
        raise ValueError(f"{who} with TrainingArguments(fsdp=...): FSDP brings its own mixed precision, which the ampkit engine does "
                         "not drive here. Drop fsdp=; AmpkitTrainer trains on one device or under DDP (torchrun). For FSDP, train "
                         "with ampkit.Engine(precision, strategy='fsdp') in your own loop.")
