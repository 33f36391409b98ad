"""Memory a training run holds, counted exactly, and the process and allocator peaks around it.

On CUDA the allocator's peak is the honest figure. On CPU there is no allocator peak to read, so the bench
counts the bytes a training step keeps resident: parameters, their gradients, optimizer state, fp32 master
weights, and the activations autograd saves for backward (counted once per storage, parameters excluded).
The process peak RSS (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) is reported beside it.

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(64, 64)
    >>> with SavedActivations(model) as saved:
    ...     model(torch.randn(8, 64)).relu().sum().backward()
    >>> saved.bytes  # the input saved by the matmul and the output saved by relu: 2 x 8 x 64 x 4 bytes
    4096
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["SavedActivations", "tensor_bytes", "training_state_bytes", "reset_peak_rss", "peak_rss_bytes"]

log = logging.getLogger("ampkit")


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (t.device.type, t.untyped_storage().data_ptr())


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (non-tensors and repeats ignored).

    >>> w = torch.zeros(10); tensor_bytes([w, w[:5], None, 3])
    40
    """
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            seen.setdefault(_storage_key(t), t.untyped_storage().nbytes())
    return sum(seen.values())


class SavedActivations:
    """Context manager counting the bytes autograd saves for backward while it is active.

    Each storage counts once (views share it); storages of the model's parameters and buffers are not
    activations and are left out. Under autocast the 16-bit copies of weights that ops save are counted: they
    are memory the step holds until backward, as activations are.
    """

    def __init__(self, *models: nn.Module) -> None:
        self._excluded = {
            _storage_key(t) for m in models for t in [*m.parameters(), *m.buffers()] if t.device.type != "meta"
        }
        self._seen: dict[tuple[str, int], int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            key = _storage_key(t)
            if key not in self._excluded:
                self._seen.setdefault(key, t.untyped_storage().nbytes())
        return t  # saved as is: counting must not change what backward sees

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def bytes(self) -> int:
        """Distinct bytes saved for backward so far."""
        return sum(self._seen.values())

    def __enter__(self) -> "SavedActivations":
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
    master_bytes = 0
    if masters is not None:
        master_bytes = tensor_bytes(masters.tensors())
    return {
        "parameters": tensor_bytes(params),
        "gradients": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        "optimizer_state": tensor_bytes(state),
        "master_weights": master_bytes,
    }


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS to its current RSS (Linux); False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5\n")  # "5" resets VmHWM, see proc(5)
        return True
    except OSError:
        log.debug("cannot reset the peak RSS here; peak_rss_bytes is the process peak since start")
        return False


def peak_rss_bytes() -> int | None:
    """The process's peak resident set size in bytes (Linux VmHWM, else getrusage), or None if unknown.

    >>> peak_rss_bytes() > 0
    True
    """
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kB on Linux
    except (ImportError, OSError):
        return None
