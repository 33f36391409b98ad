"""Exact byte accounting of a training step: training state, saved activations and the peak of live tensors.

The peak is defined once, here (:class:`StepPeak`), and both ``ampkit memory`` and ``ampkit bench`` (on the CPU,
where no allocator keeps one) report it: the most bytes of live tensor storages at any moment of the steps.

Everything here counts *storages*, once each, so views and tied weights are not counted twice, and works the
same on real tensors and on fake ones (``torch._subclasses.FakeTensorMode``), which is what lets
:func:`ampkit.memory.estimate` predict on a laptop what :func:`ampkit.memory.measure` measures on the device.

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(64, 64)
    >>> with SavedActivations(model) as saved:
    ...     model(torch.randn(8, 64)).relu().sum().backward()
    >>> saved.bytes  # the input saved by the matmul and the output saved by relu: 2 x 8 x 64 x 4 bytes
    4096
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._compat import TorchDispatchMode, tree_leaves

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["LiveBytes", "SavedActivations", "StepPeak", "storage_key", "tensor_bytes", "training_state_bytes"]


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage behind ``t``: equal for views of one storage, distinct between live storages.

    The address of the storage object, not of its data: fake and meta tensors have no data address.

    >>> w = torch.zeros(4); storage_key(w) == storage_key(w[1:]) != storage_key(torch.zeros(4))
    True
    """
    return t.untyped_storage()._cdata


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (non-tensors and repeats ignored).

    >>> w = torch.zeros(10); tensor_bytes([w, w[:5], None, 3])
    40
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen.setdefault(storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


class SavedActivations:
    """Context manager counting the most bytes autograd holds saved for backward at once while it is active.

    Each storage counts once (views share it); storages of the models' parameters and buffers are not
    activations and are left out. Under autocast the 16-bit copies of weights that ops save are counted: they
    are memory the step holds until backward, as activations are.

    A forward that follows a backward starts a new count, and :attr:`bytes` is the largest: the backward used
    (and freed) the graph before, so accumulating gradients over K micro-batches holds one micro-batch's
    activations, not K (a graph kept with ``retain_graph=True`` is the exception, and is not seen).

    >>> model = nn.Linear(64, 64)
    >>> with SavedActivations(model) as saved:
    ...     for _ in range(4):                           # 4 micro-batches, each backward frees its graph
    ...         model(torch.randn(8, 64)).sum().backward()
    >>> saved.bytes                                      # one micro-batch's input: 8 x 64 x 4 bytes
    2048
    """

    def __init__(self, *models: nn.Module) -> None:
        self._excluded = {storage_key(t) for m in models for t in [*m.parameters(), *m.buffers()]}
        self._seen: dict[int, int] = {}  # the current forward's saved storages
        self._most = 0  # the largest finished count
        self._backward_ran = False
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._backward_ran:  # the first save after a backward: a new micro-batch's forward
            self._most, self._seen, self._backward_ran = self.bytes, {}, False
        key = storage_key(t)
        if key not in self._excluded:
            self._seen.setdefault(key, t.untyped_storage().nbytes())
        return t  # saved as is: counting must not change what backward sees

    def _unpack(self, t: torch.Tensor) -> torch.Tensor:
        self._backward_ran = True  # only a backward (or a recompute inside one) unpacks
        return t

    @property
    def bytes(self) -> int:
        """The most distinct bytes saved for backward at once so far."""
        return max(self._most, sum(self._seen.values()))

    def __enter__(self) -> Self:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

def training_state_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer], masters: Any = None) -> dict[str, int]:
    """Exact bytes of ``parameters``, ``gradients``, ``optimizer_state`` and ``master_weights`` of a run.

    Gradients are counted at their parameter's dtype and size (what backward allocates), whether or not they
    exist at the moment of the call. ``masters`` is the engine's MasterWeights (fp32 copies and their gradient
    buffers), or None.

    >>> m = nn.Linear(4, 4)  # 20 fp32 values
    >>> training_state_bytes(m, [])
    {'parameters': 80, 'gradients': 80, 'optimizer_state': 0, 'master_weights': 0}
    """
    params = list(model.parameters())
    state: list[torch.Tensor] = []
    for opt in optimizers:
        for per_param in opt.state.values():
            state.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    return {
        "parameters": tensor_bytes(params),
        "gradients": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        "optimizer_state": tensor_bytes(state),
        "master_weights": tensor_bytes(masters.tensors()) if masters is not None else 0,
    }


class LiveBytes(TorchDispatchMode):
    """Tracks the bytes of live tensor storages and their peak while active, on real or fake tensors.

    Storages that exist before entering are counted once :meth:`track` is given them; every tensor an op
    returns is tracked from then on, and its bytes are released when its storage is freed. This is the
    device allocator's view without the allocator: no rounding, no cache, no kernel workspaces.

    >>> with LiveBytes() as live:
    ...     a = torch.ones(256)          # 1 KiB
    ...     b = a * 2                    # 1 KiB more
    ...     del a, b
    ...     c = torch.ones(128)          # 512 B
    >>> live.peak, live.current
    (2048, 512)
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # storage key -> the bytes it holds now

    def track(self, tensors: Iterable[Any]) -> None:
        """Count ``tensors`` (already allocated before entering) as live until they are freed."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t)

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now."""
        self.peak = self.current

    def _add(self, t: torch.Tensor) -> None:
        self._track(t.untyped_storage())

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._live:
            return
        self._live[key] = 0
        self._count(key, storage.nbytes())
        weakref.finalize(storage, self._free, key)

    def _count(self, key: int, size: int) -> None:
        self.current += size - self._live[key]
        self._live[key] = size
        self.peak = max(self.peak, self.current)

    def _free(self, key: int) -> None:
        size = self._live.pop(key, None)
        if size is not None:
            self.current -= size

    def storage_resized(self, storage: torch.UntypedStorage) -> None:
        """Count a storage's new size after ``storage.resize_()``, which dispatches no op (told by the resizer).

        >>> from ampkit._compat import resize_storages
        >>> t = torch.ones(256)
        >>> with LiveBytes() as live:
        ...     live.track([t])
        ...     resize_storages([t], None)       # 1 KiB freed, t kept
        ...     resize_storages([t], [2048])     # 2 KiB given back
        >>> live.peak, live.current
        (2048, 2048)
        """
        key = storage._cdata
        if key in self._live:
            self._count(key, storage.nbytes())
        else:
            self._track(storage)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._add(leaf)
        return out


class StepPeak(LiveBytes):
    """The peak memory of training: the most bytes of live tensor storages at any moment, each storage once.

    Enter it with the model before ``Engine.setup`` and run the steps inside: the model's parameters and buffers
    count from the start (so a policy's conversion, old and new weights side by side, shows), as does
    ``batch``, a batch in use throughout (None when each step brings its own, created inside); every tensor made
    inside counts while it lives: gradients, optimizer state, master weights, saved activations, temporaries.
    This is the one definition of "peak" that ``ampkit memory`` (:func:`ampkit.memory.estimate`) and
    ``ampkit bench`` on the CPU print; on CUDA ``torch.cuda.max_memory_allocated`` measures the same, plus the
    allocator's rounding and kernel workspaces.

    >>> model, x = nn.Linear(256, 256), torch.ones(4, 256)
    >>> with StepPeak(model, x) as peak:
    ...     model(x).sum().backward()
    >>> peak.peak - 2 * tensor_bytes(model.parameters()) - tensor_bytes([x])  # weights and gradients, x, two scalars
    8
    """

    def __init__(self, model: nn.Module, batch: Any = None) -> None:
        super().__init__()
        self.track([*model.parameters(), *model.buffers(), *tree_leaves(batch)])  # by storage: nothing kept alive
