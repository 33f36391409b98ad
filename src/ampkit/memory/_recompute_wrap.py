"""How :func:`~ampkit.memory.recompute` puts a module's forward under checkpoint, and takes it off.

The module's forward is replaced on the instance by a ``functools.partial`` of :func:`_recomputed_forward` bound
to the module, so parameter names and ``state_dict`` keys do not change, and ``copy.deepcopy`` and pickling carry
the wrapper along. Recomputation inside backward runs with throw-away copies of BatchNorm's running statistics.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__: list[str] = []  # private helpers of ampkit.memory.recompute


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Run the recomputation with throw-away copies of the running statistics of ``module``'s norm layers.

    The recomputed forward is a training forward, so BatchNorm would fold the batch into its running mean and
    variance (and count the batch) a second time. Swapping in clones, rather than restoring values afterwards,
    leaves the real buffers untouched: no in-place write bumps a version counter that autograd checks.
    """
    swapped: list[tuple[nn.Module, str, torch.Tensor]] = []
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                buf = getattr(m, name, None)
                if isinstance(buf, torch.Tensor):
                    swapped.append((m, name, buf))
                    setattr(m, name, buf.clone())
    try:
        yield
    finally:
        for m, name, buf in swapped:
            setattr(m, name, buf)


def _recomputed_forward(module: nn.Module, original: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> Any:
    """``module``'s forward under non-reentrant checkpoint (installed as ``functools.partial(this, module, ...)``).

    ``original`` is the instance-level forward that was there before (an fp32 island's, say), or None for the
    class's. A partial bound to the module, not a closure, so ``copy.deepcopy`` (FakeCopies, estimate, the
    bench's per-policy copies) and pickling carry the wrapper to the copy and point it at the copy.
    """
    forward = original if original is not None else functools.partial(type(module).forward, module)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)  # eval / no_grad: nothing is saved, so there is nothing to recompute
    names = list(kwargs)
    first = True

    def run(*flat: Any) -> Any:
        nonlocal first
        a, kw = flat[: len(flat) - len(names)], dict(zip(names, flat[len(flat) - len(names):]))
        if first:  # the forward pass itself
            first = False
            return forward(*a, **kw)
        with _running_stats_kept(module):  # the recomputation, inside backward
            return forward(*a, **kw)

    # Keyword arguments travel positionally: checkpoint has keyword arguments of its own (debug, context_fn...)
    # that would swallow the module's, and positional tensors are saved as inputs rather than closure-held.
    return checkpoint(run, *args, *kwargs.values(), use_reentrant=False)


def _is_recomputed(module: nn.Module) -> bool:
    fwd = module.__dict__.get("forward")
    return isinstance(fwd, functools.partial) and fwd.func is _recomputed_forward


def _wrap(module: nn.Module) -> None:
    original = module.__dict__.get("forward")  # an instance-level forward someone installed before us, or None
    module.forward = functools.partial(_recomputed_forward, module, original)  # type: ignore[method-assign]


def _unwrap(module: nn.Module) -> None:
    original = module.__dict__["forward"].args[1]
    if original is None:
        del module.forward  # back to the class's forward
    else:
        module.forward = original  # type: ignore[method-assign]
