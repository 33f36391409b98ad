"""Where the loop makes the host wait for the device: each host sync and the line of user code that asked for it.

A value read back to Python (``loss.item()``, ``float(t)``, ``if t > 0:``) or a device tensor copied to the CPU makes the host wait until the device has run everything queued before it, which
drains the GPU's queue and leaves it idle while the host catches up. Each such read dispatches one of a few ops
(``aten::_local_scalar_dense`` under ``.item()`` and ``bool()``, a copy to the CPU), so a dispatch mode sees them
all, on any device, and the Python stack at that moment names the line. On the CPU nothing waits (the host *is* the
device), but the same lines are the ones that will stall a GPU: counting them on a laptop is the point.

    >>> import torch
    >>> x = torch.ones(3)
    >>> with SyncFinder() as syncs:
    ...     for _ in range(2):
    ...         v = x.sum().item()
    >>> [(s.count, s.op) for s in syncs.sites()]
    [(2, 'item')]
"""

from __future__ import annotations

import os
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SyncFinder", "SyncSite"]

# The ops a read-back dispatches: the scalar read under .item()/float()/bool()/int(), and the copies that land on
# the CPU (.cpu(), .to("cpu")). Not seen yet: .tolist() and printing a tensor, which read without dispatching
# through a mode on the CPU (to check on CUDA, and to cover with torch.cuda.set_sync_debug_mode there).
_SCALAR = {torch.ops.aten._local_scalar_dense.default: "item"}
_COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)

_LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["ampkit"]) if getattr(m, "__file__", None)
)
# Python frames a read passes through on its way from the user's line: this mode, the dispatch machinery that calls
# it (dynamo's disable wrapper, the op overloads), Tensor's dunder methods and printing. A read whose first other
# frame is inside torch or ampkit is the library's own (an optimizer's step counter, which lives on the CPU even in a
# GPU run), not the loop's.
_PASS_THROUGH = tuple(
    os.path.join(os.path.dirname(torch.__file__), *parts)
    for parts in (("_compile.py",), ("_dynamo", "eval_frame.py"), ("_ops.py",), ("utils", "_python_dispatch.py"), ("_tensor.py",), ("_tensor_str.py",))
) + (__file__,)


@dataclass(frozen=True)
class SyncSite:
    """A line of code that read device values back to the host, how often, and how (``item`` or ``copy to cpu``)."""

    where: str
    """``file:line in function`` of the user's frame that made the read."""
    op: str
    count: int
    code: str
    """The line's source, stripped (empty when unavailable)."""


class SyncFinder(TorchDispatchMode):
    """A dispatch mode that records each host read-back and the user's line that caused it (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: Counter[tuple[str, str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        op = _SCALAR.get(func)
        if op is None and func in _COPIES and _lands_on_cpu(func, args, kwargs):
            op = "copy to cpu"
        if op is not None:
            site = _user_frame()
            if site is not None:
                self._seen[(site[0], op, site[1])] += 1
        return func(*args, **kwargs)

    def sites(self) -> list[SyncSite]:
        """Every line that synced, most frequent first."""
        return [SyncSite(where, op, n, code) for (where, op, code), n in self._seen.most_common()]

    @property
    def total(self) -> int:
        """All read-backs recorded."""
        return sum(self._seen.values())


def _lands_on_cpu(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    if func is torch.ops.aten._to_copy.default:
        source, target = args[0], kwargs.get("device")
        return isinstance(source, torch.Tensor) and source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    destination, source = args[0], args[1]
    return destination.device.type == "cpu" and isinstance(source, torch.Tensor) and source.device.type != "cpu"


def _user_frame() -> tuple[str, str] | None:
    """The user's line that read a value back, or None when the read is a library's own."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(_PASS_THROUGH):
            continue
        if frame.filename.startswith(_LIBRARY_DIRS):
            return None
        return f"{frame.filename}:{frame.lineno} in {frame.name}", (frame.line or "").strip()
    return None
