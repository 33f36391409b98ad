"""Autograd's graph and torch's dispatch modes: node creation numbers, whether a backward node is running, fake
tensors, the active modes, and freeing a storage in a way those modes are told of.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Private modules that torch itself imports at start-up (no import cost here), with no public equivalent in
# any torch up to 2.13.
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import _get_current_function_mode_stack as current_function_modes
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes as disable_current_modes,
    _get_current_dispatch_mode_stack,
)

__all__ = [
    "FakeTensor",
    "FakeTensorMode",
    "TorchDispatchMode",
    "autograd_sequence_nr",
    "current_function_modes",
    "disable_current_modes",
    "in_backward_node",
    "node_sequence_nr",
    "resize_storages",
]


def autograd_sequence_nr() -> int | None:
    """Autograd's per-thread count of the graph nodes created so far; None where torch lacks the counter.

    >>> isinstance(autograd_sequence_nr(), int)
    True
    """
    # torch.autograd._get_sequence_nr is private; looked up on each call so that a torch without it is a None.
    fn = getattr(torch.autograd, "_get_sequence_nr", None)
    return int(fn()) if fn is not None else None


def node_sequence_nr(node: object) -> int | None:
    """The creation number autograd gave graph node ``node`` (a ``grad_fn``); None for anything else.

    >>> x = torch.ones(1, requires_grad=True)
    >>> node_sequence_nr((x * 2).grad_fn) < node_sequence_nr((x * 3).grad_fn), node_sequence_nr(None)
    (True, None)
    """
    try:
        return int(node._sequence_nr())  # type: ignore[attr-defined]  # private method of autograd's Node
    except (AttributeError, RuntimeError):
        return None


def in_backward_node() -> bool:
    """Whether this thread is running an autograd node's backward now (``torch._C._current_autograd_node``, private).

    >>> x = torch.ones(1, requires_grad=True); seen = []
    >>> _ = x.register_hook(lambda g: seen.append(in_backward_node()))
    >>> (x * 2).sum().backward(); in_backward_node(), seen
    (False, [True])
    """
    fn = getattr(torch._C, "_current_autograd_node", None)
    return fn is not None and fn() is not None


def resize_storages(tensors: Sequence[torch.Tensor], nbytes: Sequence[int] | None) -> None:
    """Free (``nbytes=None``) or give back (one size per tensor) the storage under each tensor, keeping the tensors.

    The tensors keep their identity, shape and views (optimizers hold them), as FSDP frees its unsharded
    parameters. Resizing a storage dispatches no op, so a dispatch mode that counts live storages (such as
    ``ampkit.memory.LiveBytes``) cannot see it: each active mode with a ``storage_resized(storage)`` method is
    told instead.

    >>> t = torch.ones(4); resize_storages([t], None); t.untyped_storage().nbytes()
    0
    >>> resize_storages([t], [16]); t.shape, t.untyped_storage().nbytes()
    (torch.Size([4]), 16)
    """
    listeners = [m.storage_resized for m in _get_current_dispatch_mode_stack() if hasattr(m, "storage_resized")]
    for i, t in enumerate(tensors):
        storage = t.untyped_storage()
        storage.resize_(0 if nbytes is None else nbytes[i])
        for tell in listeners:
            tell(storage)
