"""Apex's ``amp`` API on native PyTorch: ``from ampkit.apex import amp`` and legacy code runs unchanged.

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

O1 runs the model's forward under ``torch.autocast`` (no global patching of torch); O2 keeps a 16-bit model
with fp32 BatchNorm and fp32 master weights; O3 is pure 16-bit; O0 is fp32. The 16-bit type is fp16 on CUDA
and bfloat16 on CPU unless ``half_dtype`` or $AMPKIT_APEX_HALF_DTYPE says otherwise. The page
docs/guides/apex.md sets each call beside its ampkit and native-torch equivalent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ._casts import cast_function, disable_casts, register_function
from ._handle import AmpHandle, NoOpHandle
from ._initialize import initialize
from ._scale_loss import scale_loss
from ._state import _amp_state

__all__ = [
    "initialize",
    "scale_loss",
    "master_params",
    "state_dict",
    "load_state_dict",
    "register_half_function",
    "register_float_function",
    "register_promote_function",
    "half_function",
    "float_function",
    "promote_function",
    "disable_casts",
    "init",
]


def master_params(optimizer: Any) -> Iterator[torch.Tensor]:
    """Yield the parameters ``optimizer`` steps: the fp32 masters under O2 (from initialize on), else the model's.

    Clip these, not ``model.parameters()``: ``torch.nn.utils.clip_grad_norm_(amp.master_params(opt), 1.0)``.

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    >>> [p.dtype for p in master_params(opt)]
    [torch.float32]
    """
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination: OrderedDict[str, Any] | None = None) -> OrderedDict[str, Any]:
    """Apex's amp state (``loss_scaler0``: ``{"loss_scale", "unskipped"}``, ...) plus ``master_weights`` under O2.

    Save it beside the model and optimizer; restore with :func:`load_state_dict` after ``amp.initialize``.
    """
    session = _amp_state.session
    if session is None:
        raise RuntimeError("amp.state_dict() was called before amp.initialize(); initialize first.")
    out = destination if destination is not None else OrderedDict()
    out.update(session.state_dict())
    return out


def load_state_dict(state: Mapping[str, Any]) -> None:
    """Restore :func:`state_dict` (an Apex checkpoint's ``loss_scaler*`` entries load too)."""
    session = _amp_state.session
    if session is None:
        raise RuntimeError("amp.load_state_dict() was called before amp.initialize(); initialize, then load.")
    session.load_state_dict(state)


def register_half_function(module: Any, function_name: str) -> None:
    """Run ``module.function_name`` in 16 bits inside O1 forwards (e.g. a custom CUDA op).

    >>> import types; ns = types.SimpleNamespace(op=torch.mul)
    >>> register_half_function(ns, "op")
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     ns.op(torch.ones(1), 2.0).dtype
    torch.bfloat16
    """
    register_function(module, function_name, "half")


def register_float_function(module: Any, function_name: str) -> None:
    """Run ``module.function_name`` in fp32 inside O1 forwards (e.g. ``register_float_function(torch, "sigmoid")``)."""
    register_function(module, function_name, "float")


def register_promote_function(module: Any, function_name: str) -> None:
    """Run ``module.function_name`` on the widest floating type among its inputs inside O1 forwards."""
    register_function(module, function_name, "promote")


def half_function(fn: Callable) -> Callable:
    """Decorator form of :func:`register_half_function`."""
    return cast_function(fn, "half")


def float_function(fn: Callable) -> Callable:
    """Decorator form of :func:`register_float_function`."""
    return cast_function(fn, "float")


def promote_function(fn: Callable) -> Callable:
    """Decorator form of :func:`register_promote_function`."""
    return cast_function(fn, "promote")


def init(
    enabled: bool = True,
    loss_scale: float | str = "dynamic",
    enable_caching: bool = True,
    verbose: bool = False,
    allow_banned: bool = False,
    *,
    half_dtype: torch.dtype | str | None = None,
) -> NoOpHandle:
    """Apex's pre-2019 entry point (``amp_handle = amp.init()``): O1's casts for the whole process, and a handle.

    Apex kept it to its last release with amp (its O1 ``initialize`` called it). Every matmul and conv runs
    in 16 bits and Apex's fp32 list (softmax, norms, losses...) in fp32, in and outside models, until
    ``handle._deactivate()``; on torch's autocast, without patching torch. ``allow_banned=True`` runs
    ``binary_cross_entropy`` in fp32 instead of refusing its 16-bit inputs. ``enabled=False`` returns a handle
    that does nothing. ``half_dtype`` (ampkit only) as in :func:`initialize`; ``enable_caching`` and
    ``verbose`` are accepted. ``handle.scale_loss(loss, optimizer)`` is Apex's old loss scaling.

    >>> handle = init()
    >>> (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    >>> handle._deactivate()
    >>> (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.float32
    """
    if not enabled:
        return NoOpHandle()
    handle = AmpHandle(loss_scale, enable_caching, verbose)
    handle._activate(half_dtype, allow_banned)
    _amp_state.handle = handle
    return handle
