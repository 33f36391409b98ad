"""O1's per-operation casts on ``torch.autocast``, without patching torch globally.

Apex's O1 replaced functions in ``torch``, ``torch.nn.functional`` and ``torch.Tensor`` for the whole process.
Here the model's forward runs under ``torch.autocast`` instead (an instance-level wrapper, so nothing outside
the model changes; ``amp.init()`` turns the same casts on process-wide), and two things close the gaps
between autocast and Apex's lists:

* :class:`~ampkit.apex._o1_functions.O1Functions`, a ``TorchFunctionMode`` active only inside the forward,
  applies Apex's lists where the device's autocast differs from them (fp32 softmax, norms and losses and
  16-bit RNNs on the CPU; Apex's banned functions everywhere).
* ``register_half_function`` & co. wrap the named function; the wrapper acts only while autocast is on for
  its inputs' device (inside an O1 forward), so it is inert everywhere else and may be called at any time.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import nn

from ..policy._islands import cast_floating
from ._o1_functions import FP32_FUNCTIONS, O1Functions, device_type_of

__all__ = [
    "FP32_FUNCTIONS",
    "autocast_forward",
    "is_autocast_forward",
    "register_function",
    "cast_function",
    "disable_casts",
]

CastKind = Literal["half", "float", "promote"]


def _autocast_forward(
    module: nn.Module,
    inner: Callable | None,
    device_type: str,
    dtype: torch.dtype,
    output_dtype: torch.dtype | None,
    active: Callable[[], bool] | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    forward = inner if inner is not None else functools.partial(type(module).forward, module)
    if active is not None and not active():  # the amp handle was deactivated, or its casts disabled
        out = forward(*args, **kwargs)
    else:
        with torch.autocast(device_type=device_type, dtype=dtype), O1Functions():
            out = forward(*args, **kwargs)
    return cast_floating(out, output_dtype) if output_dtype is not None else out


def autocast_forward(
    module: nn.Module, device_type: str, dtype: torch.dtype, output_dtype: torch.dtype | None, active: Callable[[], bool] | None = None
) -> None:
    """Make ``module``'s forward run under O1's casts, its floating outputs cast to ``output_dtype`` if given.

    ``active`` (the amp handle's ``is_active``) is asked at each call; while it says False the forward runs
    uncast.

    >>> m = nn.Linear(2, 2); autocast_forward(m, "cpu", torch.bfloat16, None)
    >>> m(torch.ones(1, 2)).dtype
    torch.bfloat16
    """
    # A forward already set on the instance (another wrapper) is kept and called inside autocast.
    inner = module.__dict__.get("forward")
    module.forward = functools.partial(_autocast_forward, module, inner, device_type, dtype, output_dtype, active)  # type: ignore[method-assign]


def is_autocast_forward(module: nn.Module) -> bool:
    """True when :func:`autocast_forward` has been applied to ``module``."""
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, functools.partial) and fwd.func is _autocast_forward


# ------------------------------------------------------------------------------------------ user casts
def _floating_dtypes(value: Any) -> Iterator[torch.dtype]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value.dtype
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floating_dtypes(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floating_dtypes(v)


def _target_dtype(kind: CastKind, device_type: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    if kind == "half":
        return torch.get_autocast_dtype(device_type)
    if kind == "float":
        return torch.float32
    dtypes = set(_floating_dtypes((args, kwargs)))
    if len(dtypes) <= 1:
        return None  # nothing to promote
    # The widest type wins; fp16 beside bf16 has no common 16-bit type, so both go to fp32.
    return max(dtypes, key=lambda d: torch.finfo(d).bits) if len({torch.finfo(d).bits for d in dtypes}) > 1 else torch.float32


def cast_function(fn: Callable, kind: CastKind) -> Callable:
    """Wrap ``fn`` so that, while autocast is on for its inputs, they are cast per ``kind`` and it runs uncast.

    ``"half"`` casts floating inputs to autocast's 16-bit type, ``"float"`` to fp32, ``"promote"`` to the
    widest floating type among them; ``fn`` then runs with autocast off, so its own internals are not recast.
    Outside autocast the wrapper calls ``fn`` unchanged.

    >>> f = cast_function(torch.add, "float")
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     f(torch.ones(1, dtype=torch.bfloat16), 1).dtype
    torch.float32
    """
    if getattr(fn, "_ampkit_cast", None) is not None:
        fn = fn.__wrapped__  # type: ignore[attr-defined]  # re-registering replaces the kind, never stacks

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        device_type = device_type_of(args, kwargs)
        if device_type is None or not torch.is_autocast_enabled(device_type):
            return fn(*args, **kwargs)
        dtype = _target_dtype(kind, device_type, args, kwargs)
        if dtype is not None:
            args, kwargs = cast_floating(args, dtype), cast_floating(kwargs, dtype)
        with torch.autocast(device_type=device_type, enabled=False):
            return fn(*args, **kwargs)

    wrapper._ampkit_cast = kind  # type: ignore[attr-defined]
    return wrapper


def register_function(module: Any, name: str, kind: CastKind) -> None:
    """Replace ``module.name`` by :func:`cast_function` of it. Takes effect at once, before or after initialize."""
    if not isinstance(name, str) or not hasattr(module, name):
        where = getattr(module, "__name__", type(module).__name__)
        raise ValueError(f"No function named {name!r} in {where}; register_{kind}_function(module, 'name') takes the module and the function's name.")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{getattr(module, '__name__', module)}.{name} is not callable, so it cannot be cast.")
    setattr(module, name, cast_function(fn, kind))


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """Run a block without O1's casts (autocast off on CPU and, where present, CUDA).

    >>> with torch.autocast("cpu", dtype=torch.bfloat16), disable_casts():
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.float32
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield
