"""Naming a full disk when a checkpoint save fails.

torch's zip writer turns a write the disk refused into ``RuntimeError: [enforce fail at inline_container.cc:672] .
unexpected pos 418816 vs 418704``: nothing says the disk is full. :func:`full_disk_message` recognises a failed save
as a full disk (``ENOSPC``/``EDQUOT`` anywhere in the exception's chain, or torch's short-write error while the
target's filesystem has less free space than the save needs) and says which filesystem, how much the save needs and
how much is free. It runs only after a save failed: a save that succeeds pays nothing.

    >>> import errno, tempfile, torch
    >>> full = OSError(errno.ENOSPC, "No space left on device")
    >>> full_disk_message(full, tempfile.gettempdir(), 4096).startswith("no space left on /")
    True
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from typing import Any

import torch

from .._util.units import fmt_bytes

__all__ = ["full_disk_message", "storage_bytes", "mount_point"]

# The errors a write into a full filesystem (or a full quota) gets.
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}

# How torch's zip writer reports a write that came back short or raised (the disk filled up, among other causes).
_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed writing")


def storage_bytes(state: Any) -> int:
    """Bytes of the tensor storages in ``state`` (nested dicts, lists, tuples), each storage counted once.

    What a checkpoint of ``state`` needs on disk, less the pickled structure around the tensors (small). A shard of
    a distributed tensor counts its local part.

    >>> t = torch.zeros(10)
    >>> storage_bytes({"a": t, "b": [t[:5], torch.zeros(2, dtype=torch.float64)]})
    56
    """
    seen: dict[tuple[str, int], int] = {}
    for tensor in _tensors(state):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor: this rank's shard
        storage = local.untyped_storage()
        seen[(str(local.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def mount_point(path: str | os.PathLike[str]) -> str:
    """The mount point of the filesystem that holds ``path`` (or would hold it: the nearest existing ancestor's)."""
    here = os.path.abspath(os.fspath(path))
    while not os.path.exists(here):
        here = os.path.dirname(here)
    while not os.path.ismount(here):
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return here


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def full_disk_message(exc: BaseException, directory: str | os.PathLike[str], needed: int, what: str = "the checkpoint needs") -> str | None:
    """``"no space left on <mount>: the checkpoint needs about X, Y free"`` if ``exc`` is a save into ``directory``
    that the disk refused, else None. ``needed``: the bytes the save writes (:func:`storage_bytes`); ``what``: who
    needs them (a sharded save says ``"this rank's shards need"``).

    Call it after the failed save removed its temporary file: Y is then the space free for the next try.
    """
    errors = list(_chain(exc))
    refused = any(isinstance(e, OSError) and e.errno in _FULL for e in errors)
    short = any(isinstance(e, RuntimeError) and any(s in str(e) for s in _SHORT_WRITE) for e in errors)
    if not (refused or short):
        return None
    mount = mount_point(directory)
    try:
        free = shutil.disk_usage(mount).free
    except OSError:
        return None
    if not refused and free >= needed:  # a short write with room to spare: something else failed
        return None
    return f"no space left on {mount}: {what} about {fmt_bytes(needed)}, {fmt_bytes(free)} free"
