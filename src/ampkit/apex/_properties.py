"""Apex's opt levels O0-O3 as a property table, the overrides ``amp.initialize`` accepts, and their checks.

The table and the consistency rules follow Apex's documentation: O0 is fp32; O1 casts per op (here through
``torch.autocast``); O2 stores the model in 16 bits with fp32 BatchNorm and fp32 master weights; O3 is pure
16-bit. One departure: the 16-bit type of O1-O3 is the device's (fp16 on CUDA as in Apex, bfloat16 on CPU,
where fp16 runs about 20x slower than fp32), so the table printed on CPU says ``torch.bfloat16``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .._errors import PolicyError

__all__ = ["OptLevelError", "Properties", "OPT_LEVELS", "resolve_half_dtype", "resolve_properties", "describe"]

HALF_DTYPE_ENV = "AMPKIT_APEX_HALF_DTYPE"
_HALF_NAMES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


class OptLevelError(PolicyError, RuntimeError):
    """An opt level or override that Apex would also refuse (a RuntimeError there, a ValueError in ampkit)."""


@dataclass(frozen=True)
class Properties:
    """The options an opt level sets, in Apex's order (its printout lists them this way).

    >>> OPT_LEVELS["O2"].master_weights, OPT_LEVELS["O2"].loss_scale
    (True, 'dynamic')
    """

    enabled: bool = False
    opt_level: str | None = None
    cast_model_type: torch.dtype | None = None
    patch_torch_functions: bool = False
    keep_batchnorm_fp32: bool | None = None
    master_weights: bool | None = None
    loss_scale: float | str = 1.0

    def lines(self) -> list[str]:
        """One ``name : value`` line per option, aligned as Apex printed them."""
        return [f"{f.name:22} : {getattr(self, f.name)}" for f in fields(self)]


# ``cast_model_type`` of O2/O3 is a placeholder here: resolve_properties puts the device's 16-bit type there.
_HALF = torch.float16
OPT_LEVELS: dict[str, Properties] = {
    "O0": Properties(True, "O0", torch.float32, False, None, False, 1.0),
    "O1": Properties(True, "O1", None, True, None, None, "dynamic"),
    "O2": Properties(True, "O2", _HALF, False, True, True, "dynamic"),
    "O3": Properties(True, "O3", _HALF, False, False, False, 1.0),
}

BRIEF = {
    "O0": "O0:  Pure FP32 training.",
    "O1": "O1:  Insert automatic casts around Pytorch functions and Tensor methods.",
    "O2": "O2:  FP16 training with FP32 batchnorm and FP32 master weights.",
    "O3": "O3:  Pure FP16 training.",
}


def check_opt_level(opt_level: Any) -> str:
    """Return ``opt_level`` if it is one of O0-O3, else raise naming the likely intended one.

    >>> check_opt_level("01")
    Traceback (most recent call last):
    ...
    ampkit.apex._properties.OptLevelError: Unexpected optimization level '01'. Did you mean 'O1'? The prefix is the letter O, not the digit zero. Options are 'O0', 'O1', 'O2', 'O3'.
    """
    if isinstance(opt_level, str) and opt_level in OPT_LEVELS:
        return opt_level
    hint = ""
    if isinstance(opt_level, str):
        key = opt_level.strip()
        guess = "O" + key[1:] if key[:1] in ("0", "o") else key.upper()
        if guess in OPT_LEVELS:
            hint = f" Did you mean {guess!r}? The prefix is the letter O, not the digit zero."
    raise OptLevelError(f"Unexpected optimization level {opt_level!r}.{hint} Options are 'O0', 'O1', 'O2', 'O3'.")


def resolve_half_dtype(device_type: str, half_dtype: Any = None) -> torch.dtype:
    """The 16-bit type O1-O3 use: ``half_dtype``, else $AMPKIT_APEX_HALF_DTYPE, else fp16 on CUDA, bf16 on CPU.

    >>> resolve_half_dtype("cpu"), resolve_half_dtype("cuda"), resolve_half_dtype("cpu", "float16")
    (torch.bfloat16, torch.float16, torch.float16)
    """
    source = "half_dtype"
    if half_dtype is None and os.environ.get(HALF_DTYPE_ENV):
        half_dtype, source = os.environ[HALF_DTYPE_ENV], f"${HALF_DTYPE_ENV}"
    if half_dtype is None:
        return torch.bfloat16 if device_type == "cpu" else torch.float16
    dtype = _HALF_NAMES.get(half_dtype.strip().lower()) if isinstance(half_dtype, str) else half_dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{source}={half_dtype!r} is not a 16-bit float type; use torch.float16 or torch.bfloat16 ('float16' or 'bfloat16').")
    return dtype


def _as_bool_or_none(name: str, value: Any) -> bool | None:
    # Apex accepted the strings "True"/"False" here because argparse hands them over as strings.
    if value in ("True", "False"):
        return value == "True"
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be True, False, None or the string 'True'/'False', got {value!r}.")


def _as_loss_scale(value: Any) -> float | str:
    if value == "dynamic":
        return "dynamic"
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"loss_scale must be 'dynamic' or a positive number such as 128.0 (a string like '128.0' works), got {value!r}.") from None
    if not (scale > 0 and scale != float("inf")):
        raise ValueError(f"loss_scale must be a positive finite number or 'dynamic', got {value!r}.")
    return scale


def resolve_properties(opt_level: str, half: torch.dtype, overrides: dict[str, Any]) -> Properties:
    """Apply ``overrides`` (the non-None keyword arguments of initialize) to ``opt_level``'s defaults.

    Raises OptLevelError for the combinations Apex refused, with the reason and what to pass instead.

    >>> resolve_properties("O2", torch.bfloat16, {"loss_scale": "128.0"}).loss_scale
    128.0
    """
    base = OPT_LEVELS[opt_level]
    if base.cast_model_type is _HALF:
        base = replace(base, cast_model_type=half)
    o1 = opt_level == "O1"
    out: dict[str, Any] = {}
    for name, value in overrides.items():
        if name == "cast_model_type":
            if value is not None and value is not False and value not in (torch.float16, torch.bfloat16, torch.float32):
                raise ValueError(f"cast_model_type must be torch.float16, torch.bfloat16 or torch.float32, got {value!r}.")
            if o1 and value not in (None, False, torch.float32):
                raise OptLevelError(
                    "O1 casts per operation and keeps the model's weights in fp32, so cast_model_type must stay None with O1 "
                    f"(got {value}). To store the model in 16 bits use opt_level='O2' or 'O3'."
                )
            out[name] = value or None
        elif name == "patch_torch_functions":
            if value and not o1:
                raise OptLevelError("patch_torch_functions=True is what opt_level='O1' means; select O1 instead of overriding it.")
            out[name] = bool(value)
        elif name == "keep_batchnorm_fp32":
            flag = _as_bool_or_none(name, value)
            if o1 and flag is not None:
                raise OptLevelError(f"O1 already runs batch norm in fp32, so keep_batchnorm_fp32 must be None with O1 (got {value!r}).")
            out[name] = flag
        elif name == "master_weights":
            if o1 and value is not None:
                raise OptLevelError("O1 keeps the model's weights in fp32, so master weights make no sense there; drop master_weights or use O2.")
            out[name] = _as_bool_or_none(name, value)
        elif name == "loss_scale":
            out[name] = _as_loss_scale(value)
        else:  # pragma: no cover - initialize passes only the names above
            raise TypeError(f"unknown property {name!r}")
    return replace(base, **out)


def describe(opt_level: str, defaults: Properties, final: Properties) -> list[str]:
    """The lines ``initialize`` prints at verbosity 1, in Apex's layout (tools parse them)."""
    return [
        f"Selected optimization level {BRIEF[opt_level]}",
        "",
        "Defaults for this optimization level are:",
        *defaults.lines(),
        "Processing user overrides (additional kwargs that are not None)...",
        "After processing overrides, optimization options are:",
        *final.lines(),
    ]
