"""Apex's O1 function lists where ``torch.autocast`` differs from them, as one ``TorchFunctionMode``.

Autocast does most of O1: Apex's FP16 list (conv, linear, matmul, mm, bmm, addmm...) is autocast's 16-bit
list, and its promote list (cat, stack, addcmul...) autocast's promote list. What autocast does differently,
this mode does, while autocast is on for the inputs' device:

* Apex's FP32 list: CPU autocast keeps softmax, norms, losses, ``pow``, ``sum``... in 16 bits; their 16-bit
  inputs are cast to fp32. CUDA's autocast already runs most of them in fp32, all but
  :data:`CUDA_AUTOCAST_GAPS` (``std``, ``var`` and two composites), which are cast here on CUDA too.
* Functions on Apex's FP16 list that CPU autocast leaves alone: ``mv``, ``addmv``, ``addr``, and the RNNs and
  RNN cells (``_VF.lstm``, ``_VF.gru_cell``...). Their floating inputs, hidden state and weights are cast
  to the 16-bit type and they run with autocast off, as Apex's ``rnn_cast`` ran them. Off, because CPU
  autocast would send ``lstm`` to oneDNN's 16-bit LSTM, which has no fp16 form on most CPUs (a
  RuntimeError). CUDA's autocast casts all of them itself (cuDNN RNNs included).
* In-place forms of the fp32 list (``x.exp_()``) on 16-bit tensors raise, as in Apex, on every device.
* Apex's banned list (``binary_cross_entropy``): 16-bit inputs raise Apex's NotImplementedError naming the
  fix, or with ``allow_banned`` run in fp32. fp32 inputs run in fp32. Autocast is off for the call, so CUDA
  (whose autocast refuses the function outright) and the CPU (whose autocast runs it in fp32) agree.
* Apex's promote list (:data:`PROMOTE_FUNCTIONS`): a 16-bit tensor meeting a wider one runs in the wider type.
  torch's own type promotion does that already, but for a 16-bit tensor beside a 0-dim fp32 one
  (``h * torch.tensor(0.5)`` stays 16-bit in torch, was fp32 under Apex), which is cast here on every device;
  ``cross``, ``dot`` and ``bilinear`` refuse mixed types in torch and are cast on the CPU (CUDA's autocast
  promotes them itself).
* ``Tensor.cpu`` (Apex's tensor fp32 list): a 16-bit tensor on an accelerator is cast to fp32 *before* the
  copy, so the host receives fp32 (``out.cpu().numpy()`` of a CUDA fp16 tensor is float32, as under Apex).
  On the CPU nothing is copied and nothing is cast: ``x.cpu()`` returns ``x`` itself, 16-bit or not, as Apex
  (which cast CUDA tensors only) did.
* ``x **= y`` (``Tensor.__ipow__``, on Apex's tensor fp32 list): a 16-bit ``x`` is raised in fp32 into a new
  tensor that the name is rebound to, as under Apex, where ``x.pow_(y)`` refuses 16-bit ``x``.

Apex's lists read for this: ``apex/amp/lists/{torch,functional,tensor}_overrides.py`` at e13873de (the last
Apex commit with ``apex/amp``); Apex cast inputs, on CUDA tensors only (``utils.maybe_float``), and ran the
original function on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..policy._islands import cast_floating

__all__ = [
    "FP32_FUNCTIONS",
    "HALF_FUNCTIONS",
    "BANNED_FUNCTIONS",
    "PROMOTE_FUNCTIONS",
    "CUDA_AUTOCAST_GAPS",
    "O1Functions",
    "autocast_covers_apex_lists",
    "device_type_of",
]

# Apex's fp32 lists (torch, torch.nn.functional, Tensor methods), matched by name so that ``torch.sum``,
# ``x.sum()`` and ``x ** 2`` (Tensor.__pow__ is named "pow") are all caught. In-place forms are left out:
# upcasting ``self`` would make them write into a copy.
FP32_FUNCTIONS = frozenset(
    ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow", "__rpow__", "cumprod", "cumsum", "dist", "norm", "prod", "std", "sum", "var", "renorm", "logsumexp", "pdist", "cdist", "interpolate", "grid_sample", "softplus", "softmin", "softmax", "log_softmax", "gelu", "layer_norm", "group_norm", "local_response_norm", "normalize", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss", "kl_div", "l1_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "multi_margin_loss", "nll_loss", "binary_cross_entropy_with_logits", "smooth_l1_loss", "huber_loss", "soft_margin_loss", "triplet_margin_loss", "ctc_loss"]
)

# Apex's FP16 list minus what CPU autocast already casts; the RNN names are those of torch._VF that
# nn.RNNBase and the nn.*Cell modules call.
HALF_FUNCTIONS = frozenset(
    ["mv", "addmv", "addr", "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"]
)

BANNED_FUNCTIONS = frozenset({"binary_cross_entropy"})

# Apex's promote lists (torch functions and Tensor operators; in-place forms left to torch, which computes them
# in self's type as Apex did): mixed 16-bit and wider floating inputs run in the wider type.
PROMOTE_FUNCTIONS = frozenset(["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "addcdiv", "addcmul", "atan2", "cross", "dot", "bilinear"])

# Of those, the ones torch itself refuses on mixed types (the rest promote natively, but for a 0-dim wider tensor).
_NO_NATIVE_PROMOTION = frozenset({"cross", "dot", "bilinear"})

# What CUDA's autocast leaves undone of Apex's lists (its fp32, fp32-output and promote lists, torch 2.4 to 2.13,
# aten/src/ATen/autocast_mode.h): std, var, gelu and ctc_loss are on none of them; two composites run 16-bit inner
# ops (local_response_norm's average pool, multilabel_soft_margin_loss's logsigmoid); grid_sampler is only
# promoted, so all-16-bit inputs stay 16-bit; and the arithmetic and comparisons are on none (their 0-dim case).
# Everything else on the lists CUDA's autocast casts itself (addcmul, cross, dot... are on its promote list).
CUDA_AUTOCAST_GAPS = frozenset(
    {"std", "var", "gelu", "ctc_loss", "grid_sample", "local_response_norm", "multilabel_soft_margin_loss"}
    | (PROMOTE_FUNCTIONS - {"addcdiv", "addcmul", "atan2"} - _NO_NATIVE_PROMOTION)
)

# In-place forms of the fp32 list (``x.exp_()``): fp32 cannot be written into a 16-bit tensor, so Apex refused
# them on 16-bit inputs rather than round the fp32 result back down.
_FP32_IN_PLACE = frozenset(name + "_" for name in FP32_FUNCTIONS)

_BANNED_MESSAGE = (
    "amp does not work out-of-the-box with `F.binary_cross_entropy` or `torch.nn.BCELoss` on 16-bit inputs "
    "(here: {name} on {dtype}): the output of the previous function must already be fp32.\n"
    "Most models have a sigmoid right before BCELoss; use torch.nn.BCEWithLogitsLoss (or "
    "F.binary_cross_entropy_with_logits), which combines both and is safe in 16 bits.\n"
    "Another option: amp.register_float_function(torch, 'sigmoid').\n"
    "If you really know what you are doing, pass allow_banned=True to amp.init() to run it in fp32."
)

_HALF_TYPES = (torch.float16, torch.bfloat16)
# Tensor.__ipow__ reaches a mode under pow_'s name (torch wraps pow_ for it), so it is told apart by identity.
_IPOW = torch.Tensor.__ipow__
_WATCHED = FP32_FUNCTIONS | HALF_FUNCTIONS | BANNED_FUNCTIONS | _FP32_IN_PLACE | PROMOTE_FUNCTIONS | {"cpu"}


def autocast_covers_apex_lists(device_type: str, name: str) -> bool:
    """Whether torch's autocast on ``device_type`` already casts function ``name`` as Apex's lists did (CUDA's
    does, but for :data:`CUDA_AUTOCAST_GAPS`).

    >>> autocast_covers_apex_lists("cuda", "softmax"), autocast_covers_apex_lists("cuda", "std")
    (True, False)
    >>> autocast_covers_apex_lists("cpu", "softmax")
    False
    """
    return device_type == "cuda" and name not in CUDA_AUTOCAST_GAPS


def device_type_of(args: tuple, kwargs: dict) -> str | None:
    """The device type of the first tensor among ``args`` and ``kwargs`` (lists searched), else None.

    >>> device_type_of((1, [torch.ones(1)]), {})
    'cpu'
    """
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
        if isinstance(value, (list, tuple)):
            found = device_type_of(tuple(value), {})
            if found is not None:
                return found
    return None


def _upcast_half(value: Any) -> Any:
    """Cast 16-bit floating tensors inside ``value`` to fp32; leave fp32, fp64 and integer tensors alone."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _HALF_TYPES else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_upcast_half(v) for v in value)
    return value


def _half_input(args: tuple, kwargs: dict) -> torch.dtype | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dtype in _HALF_TYPES:
            return value.dtype
    return None


def _promotion(name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The type Apex's promote lists run ``name`` in, when torch would not reach it by itself; else None.

    Only a 16-bit tensor meeting a wider floating one is promoted (fp16 beside bf16 goes to fp32). torch's
    type promotion already gives the wider type unless the wider tensors are all 0-dim, since a 0-dim tensor
    does not widen a dimensioned one of its category; those calls pass through untouched, with no cast kernel.

    >>> h, w = torch.ones(3, dtype=torch.float16), torch.tensor(0.5)
    >>> _promotion("mul", (h, w), {}), _promotion("mul", (h, w.expand(3)), {}), _promotion("dot", (h, w.expand(3)), {})
    (torch.float32, None, torch.float32)
    """
    target = shaped = None  # the widest floating type of all tensors, and of the dimensioned ones
    half = False
    for v in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            d = v.dtype
            half = half or d in _HALF_TYPES
            target = d if target is None else _wider(target, d)
            if v.dim() > 0:
                shaped = d if shaped is None else _wider(shaped, d)
    if not half or target in _HALF_TYPES and (shaped is None or shaped == target):
        return None  # no 16-bit input, or one 16-bit type throughout
    if name in _NO_NATIVE_PROMOTION:
        return target
    native = target if shaped is None else shaped
    return target if native != target else None


def _mixed(args: tuple, kwargs: dict) -> bool:
    """Whether the tensors among ``args`` and ``kwargs`` have more than one type: the fast test that spares the
    common call (``h + h``) the rest of the promote path."""
    seen = None
    for v in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(v, torch.Tensor):
            if seen is None:
                seen = v.dtype
            elif v.dtype != seen:
                return True
    return False


def _wider(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """torch.promote_types for floating types, in Python: that function dispatches an op (seen by dispatch modes)."""
    if a.itemsize != b.itemsize:
        return a if a.itemsize > b.itemsize else b
    return a if a == b else torch.float32  # fp16 and bf16


def _run_uncast(func: Callable, device_type: str, dtype: torch.dtype, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on its floating inputs cast to ``dtype``, with autocast off (so nothing recasts them)."""
    args, kwargs = cast_floating(args, dtype), cast_floating(kwargs, dtype)
    with torch.autocast(device_type, enabled=False):
        return func(*args, **kwargs)


class O1Functions(TorchFunctionMode):
    """Applies Apex's O1 lists where autocast differs from them, while autocast is on (see the module doc).

    >>> with torch.autocast("cpu", dtype=torch.bfloat16), O1Functions():
    ...     torch.ones(2, dtype=torch.bfloat16).sum().dtype
    torch.float32
    """

    def __init__(self, allow_banned: bool = False) -> None:
        super().__init__()
        self.allow_banned = allow_banned

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name not in _WATCHED:  # the common case: one set lookup per torch call
            return func(*args, **kwargs)
        if name in PROMOTE_FUNCTIONS:
            # Checked before the device, as these are the most frequent calls: `h + h` and `h * 2.0` have nothing
            # to promote, and `h + x` (x fp32, not 0-dim) is promoted by torch itself.
            target = _promotion(name, args, kwargs) if _mixed(args, kwargs) else None
            if target is None:
                return func(*args, **kwargs)
        device_type = device_type_of(args, kwargs)
        if device_type is None or not torch.is_autocast_enabled(device_type):
            return func(*args, **kwargs)
        if name in BANNED_FUNCTIONS:
            half = _half_input(args, kwargs)
            if half is not None and not self.allow_banned:
                raise NotImplementedError(_BANNED_MESSAGE.format(name=name, dtype=half))
            return _run_uncast(func, device_type, torch.float32, args, kwargs)
        if func is _IPOW:  # `x **= y`: Apex raised a 16-bit x in fp32 and rebound the name to the new tensor
            return func(*(_upcast_half(a) for a in args), **kwargs)
        if name in _FP32_IN_PLACE:
            half = _half_input(args, kwargs)
            if half is not None:
                raise NotImplementedError(
                    f"Cannot call in-place function {name} with {half} arguments under O1: {name[:-1]} runs in fp32 "
                    f"there, and its result cannot be written into a 16-bit tensor. Use x = x.{name[:-1]}(...) instead."
                )
            return func(*args, **kwargs)
        if name == "cpu":
            # Cast before the copy, so the host receives fp32 (half the bytes saved on the link would be lost
            # to the script's own upcast anyway). A CPU tensor is not copied, so it is returned as it is.
            if device_type != "cpu":
                return func(_upcast_half(args[0]), *args[1:], **kwargs)
            return func(*args, **kwargs)
        if autocast_covers_apex_lists(device_type, name):
            return func(*args, **kwargs)
        if name in HALF_FUNCTIONS:
            return _run_uncast(func, device_type, torch.get_autocast_dtype(device_type), args, kwargs)
        if name in PROMOTE_FUNCTIONS:
            return func(*cast_floating(args, target), **cast_floating(kwargs, target))
        return func(*(_upcast_half(a) for a in args), **{k: _upcast_half(v) for k, v in kwargs.items()})
