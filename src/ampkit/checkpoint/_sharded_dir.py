"""Putting a sharded checkpoint directory in place atomically, and finding it again after a crash mid-swap.

A directory cannot be renamed over a non-empty one, so a save writes ``<path>.<token>.tmp``, moves the old
checkpoint aside to ``<path>.<token>.old``, renames the new one to ``<path>`` and deletes the old one. A process
killed between the two renames leaves no ``<path>`` at all, but two complete checkpoints beside it:
:func:`find_checkpoint` returns the newest complete one, so a resumed run loads it instead of starting over,
and the next save removes every leftover of earlier, killed saves (:func:`remove_leftovers`).

    >>> import tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("ckpt.1a.old", "ckpt.2b.tmp"):
    ...     (root / name).mkdir(); (root / name / ".metadata").touch()
    >>> (root / "ckpt.1a.old" / "ampkit.pt").touch()
    >>> find_checkpoint(root / "ckpt").name      # the .tmp lacks ampkit.pt: its save never finished
    'ckpt.1a.old'
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

from ..fileio._checkpoint_files import _fsync_directory

__all__ = ["ENGINE_FILE", "swap_into_place", "find_checkpoint", "remove_leftovers", "is_complete"]

log = logging.getLogger("ampkit")

ENGINE_FILE = "ampkit.pt"
"""Inside a sharded checkpoint directory: everything that is not a model or optimizer shard; written last."""


def is_complete(directory: pathlib.Path) -> bool:
    """Whether ``directory`` holds a finished sharded checkpoint (DCP's ``.metadata`` and ampkit's own file)."""
    return (directory / ".metadata").is_file() and (directory / ENGINE_FILE).is_file()


def _leftovers(target: pathlib.Path) -> list[pathlib.Path]:
    """``<name>.<token>.tmp`` and ``<name>.<token>.old`` beside ``target``: what saves leave while they run or when killed."""
    if not target.parent.is_dir():
        return []
    return sorted(p for suffix in ("tmp", "old") for p in target.parent.glob(f"{target.name}.*.{suffix}") if p.name.count(".") >= 2)


def swap_into_place(tmp: pathlib.Path, target: pathlib.Path, token: str) -> None:
    """Make the finished directory ``tmp`` the checkpoint at ``target``; ``target`` is never half of either."""
    old = target.with_name(f"{target.name}.{token}.old") if target.exists() else None
    if old is not None:
        os.replace(target, old)
    # A crash here leaves no target, but tmp and old both complete: find_checkpoint picks the newer one.
    os.replace(tmp, target)
    _fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def find_checkpoint(target: str | os.PathLike[str]) -> pathlib.Path | None:
    """The checkpoint to load for ``target``: itself if it exists, else the newest complete leftover of a swap, else None."""
    target = pathlib.Path(os.fspath(target))
    if target.exists():
        return target
    complete = [p for p in _leftovers(target) if p.is_dir() and is_complete(p)]
    if not complete:
        return None
    # ampkit.pt is written after every shard and .metadata: the newest one belongs to the newest finished save.
    newest = max(complete, key=lambda p: (p / ENGINE_FILE).stat().st_mtime_ns)
    log.warning("no checkpoint at %s: a save was interrupted while swapping it into place; loading %s, its newest complete copy.", target, newest)
    return newest


def remove_leftovers(target: pathlib.Path) -> None:
    """Delete what earlier saves to ``target`` left (killed mid-write or mid-swap); call after a save succeeded."""
    for path in _leftovers(target):
        try:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        except OSError as exc:  # another process's files, a read-only mount: worth a word, never a failed save
            log.warning("could not remove %s left by an interrupted save: %s", path, exc)
