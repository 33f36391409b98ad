"""fp32 islands: modules that run in float32 inside a 16-bit or autocast model.

A module kept in fp32 gets its floating inputs cast to float32 and runs with autocast disabled; under a
16-bit-weights policy its floating outputs are cast back to the model's dtype so the next 16-bit layer
receives what it expects. The forward is replaced by a ``functools.partial`` bound to the module itself
rather than a closure, so ``copy.deepcopy`` and pickling carry the island to the copy correctly.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from .._errors import PolicyError

__all__ = ["KeepFp32", "check_keep_fp32", "cast_floating", "match_modules", "make_fp32_island", "is_fp32_island", "retarget_islands", "NORM_TYPES"]

KeepFp32 = Sequence["str | type[nn.Module]"]

# Normalisation layers: their statistics (mean, variance) lose too much in 16 bits, which is why Apex O2 keeps
# BatchNorm in fp32. The master-weight policies generalise that to every normalisation type.
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm*
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """Cast every floating-point tensor inside ``value`` (tensors, lists, tuples, dicts) to ``dtype``.

    >>> cast_floating((torch.ones(1), 3), torch.bfloat16)[0].dtype
    torch.bfloat16
    """
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(cast_floating(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(v, dtype) for v in value)
    if type(value) is dict:
        # A comprehension, not dict.copy(): torch.compile traces it, so the *-true policies' input-cast hook
        # (which always gets a plain dict of keyword arguments) compiles without a graph break.
        return {k: cast_floating(v, dtype) for k, v in value.items()}
    if isinstance(value, dict):
        # A shallow copy keeps the mapping's type and extras (a defaultdict's factory, an OrderedDict's order).
        out = copy.copy(value)
        for k, v in value.items():
            out[k] = cast_floating(v, dtype)
        return out
    return value


_KEEP_FORMS = "module names such as 'head' or 'blocks.*.attn', or nn.Module subclasses such as nn.LayerNorm"


def check_keep_fp32(keep: Any) -> tuple[str | type[nn.Module], ...]:
    """``keep`` as a tuple of entries, each a module name (shell wildcards allowed) or an ``nn.Module`` subclass.

    One name or type on its own is one entry, not an iterable of characters. Anything else raises PolicyError
    naming the bad entry, where the policy is resolved rather than much later when it is applied.

    >>> check_keep_fp32("head"), check_keep_fp32([nn.LayerNorm, "blocks.*.attn"])
    (('head',), (<class 'torch.nn.modules.normalization.LayerNorm'>, 'blocks.*.attn'))
    >>> check_keep_fp32([5])
    Traceback (most recent call last):
    ...
    ampkit.PolicyError: keep_fp32 entry 0 is int 5; each entry must be one of: module names such as 'head' or 'blocks.*.attn', or nn.Module subclasses such as nn.LayerNorm.
    """
    if isinstance(keep, (str, type)):
        keep = (keep,)
    elif isinstance(keep, (bytes, dict)) or not isinstance(keep, Iterable):
        raise PolicyError(f"keep_fp32 takes a list of {_KEEP_FORMS}; got {type(keep).__name__} {keep!r}.")
    entries = tuple(keep)
    for i, entry in enumerate(entries):
        if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, nn.Module))):
            raise PolicyError(f"keep_fp32 entry {i} is {type(entry).__name__} {entry!r}; each entry must be one of: {_KEEP_FORMS}.")
    return entries


def match_modules(model: nn.Module, keep: Iterable[str | type[nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Return the outermost ``(name, module)`` pairs of ``model`` that ``keep`` selects.

    Entries are module types (``nn.LayerNorm``) or qualified names with shell wildcards (``"head"``,
    ``"blocks.*.attn"``). A name that selects nothing raises PolicyError naming the closest real modules,
    since a typo would otherwise silently leave a fragile layer in 16 bits.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    >>> [name for name, _ in match_modules(m, [nn.LayerNorm])]
    ['1']
    """
    keep = list(keep)
    names = [k for k in keep if isinstance(k, str)]
    types = tuple(k for k in keep if isinstance(k, type) and issubclass(k, nn.Module))
    bad = [k for k in keep if not isinstance(k, str) and k not in types]
    if bad:
        raise PolicyError(f"keep_fp32 takes module names or nn.Module subclasses; got {bad!r}.")
    named = list(model.named_modules())
    for pattern in names:
        if not any(fnmatch.fnmatchcase(name, pattern) for name, _ in named):
            import difflib

            close = difflib.get_close_matches(pattern, [n for n, _ in named if n], n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise PolicyError(f"keep_fp32 entry {pattern!r} matches no module of {type(model).__name__}.{hint}")
    selected: list[tuple[str, nn.Module]] = []
    for name, module in named:
        if any(name == s or name.startswith(s + ".") for s, _ in selected if s) or (selected and selected[0][0] == ""):
            continue  # inside an island already chosen
        if (types and isinstance(module, types)) or any(fnmatch.fnmatchcase(name, p) for p in names):
            selected.append((name, module))
    return selected


def _island_forward(module: nn.Module, device_type: str, output_dtype: torch.dtype | None, *args: Any, **kwargs: Any) -> Any:
    args, kwargs = cast_floating(args, torch.float32), cast_floating(kwargs, torch.float32)
    with torch.autocast(device_type=device_type, enabled=False):
        out = type(module).forward(module, *args, **kwargs)
    return cast_floating(out, output_dtype) if output_dtype is not None else out


def make_fp32_island(module: nn.Module, device_type: str, output_dtype: torch.dtype | None = None) -> None:
    """Make ``module`` run in fp32 with autocast off; cast its outputs to ``output_dtype`` if given.

    >>> norm = nn.LayerNorm(4).bfloat16()
    >>> make_fp32_island(norm.float(), "cpu", output_dtype=torch.bfloat16)
    >>> norm(torch.ones(2, 4, dtype=torch.bfloat16)).dtype
    torch.bfloat16
    """
    if "forward" in module.__dict__ and not is_fp32_island(module):
        raise PolicyError(
            f"{type(module).__name__} already has an instance-level forward; ampkit cannot keep it in fp32. "
            "Remove the patched forward or leave this module out of keep_fp32."
        )
    # The island's own weights must be fp32 too: a model that arrived in 16 bits would otherwise meet fp32
    # inputs with 16-bit weights. Assigning .data keeps each Parameter object, so optimizers stay valid.
    for t in [*module.parameters(), *module.buffers()]:
        if t.is_floating_point() and t.dtype != torch.float32:
            t.data = t.data.float()
    module.forward = functools.partial(_island_forward, module, device_type, output_dtype)


def is_fp32_island(module: nn.Module) -> bool:
    """True when :func:`make_fp32_island` has been applied to ``module``."""
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, functools.partial) and fwd.func is _island_forward


def retarget_islands(model: nn.Module, device_type: str) -> int:
    """Point every fp32 island inside ``model`` at ``device_type``'s autocast; returns how many changed.

    An island turns autocast off for the device it was made for. A model converted before a framework moved it
    (``Engine.setup_module`` in a Lightning or Accelerate run) is re-pointed once it is on its device.

    >>> norm = nn.LayerNorm(2); make_fp32_island(norm, "cuda")
    >>> retarget_islands(nn.Sequential(norm), "cpu"), norm.forward.args[1]
    (1, 'cpu')
    """
    changed = 0
    for m in model.modules():
        fwd = m.__dict__.get("forward")
        if isinstance(fwd, functools.partial) and fwd.func is _island_forward and fwd.args[1] != device_type:
            m.forward = functools.partial(_island_forward, m, device_type, *fwd.args[2:])
            changed += 1
    return changed
