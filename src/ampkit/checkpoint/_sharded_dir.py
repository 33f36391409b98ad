"""Putting a sharded checkpoint directory in place atomically, and finding it again after a crash mid-swap.

A save writes ``<path>.<token>.tmp``, then exchanges it with the old checkpoint in one atomic step (Linux's
``renameat2(RENAME_EXCHANGE)``, macOS's ``renamex_np(RENAME_SWAP)``) and deletes the old one, now at the
``.tmp`` name: ``<path>`` holds a complete checkpoint, the old or the new, at every instant, whatever is killed
when. Where no exchange exists (Windows, a filesystem that refuses it, such as some network mounts; a warning says
so once), a directory cannot be renamed over a non-empty one, so the swap is two renames: the old checkpoint aside
to ``<path>.<token>.old``, the new one to ``<path>``. A process killed between them leaves no ``<path>`` at all,
but two complete checkpoints beside it: :func:`find_checkpoint` returns the newest complete one, so a resumed run
that loads through ampkit (``engine.load``, ``checkpoint_exists``) finds it; ``path.exists()`` does not. Either way
the next save removes every leftover of earlier, killed saves (:func:`remove_leftovers`).

    >>> import tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("ckpt.1a.old", "ckpt.2b.tmp"):
    ...     (root / name).mkdir(); (root / name / ".metadata").touch()
    >>> (root / "ckpt.1a.old" / "ampkit.pt").touch()
    >>> find_checkpoint(root / "ckpt").name      # the .tmp lacks ampkit.pt: its save never finished
    'ckpt.1a.old'
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import pathlib
import shutil
import sys
from collections.abc import Callable

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


@functools.cache
def _exchange_call() -> Callable[[bytes, bytes], int] | None:
    """The C call that swaps two paths atomically on this platform (0 on success, -1 and errno set), or None."""
    if sys.platform.startswith("linux"):
        # glibc's renameat2 (glibc >= 2.28, Linux >= 3.15); AT_FDCWD: paths relative to the working directory.
        at_fdcwd, rename_exchange = -100, 2
        function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        if function is None:
            return None
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        return lambda a, b: int(function(at_fdcwd, a, at_fdcwd, b, rename_exchange))
    if sys.platform == "darwin":  # renamex_np (macOS >= 10.12), RENAME_SWAP
        function = getattr(ctypes.CDLL(None, use_errno=True), "renamex_np", None)
        if function is None:
            return None
        function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        return lambda a, b: int(function(a, b, 0x2))
    return None


# What a kernel or filesystem without the exchange answers: not implemented, an unknown flag, not supported.
_NO_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap the paths ``a`` and ``b`` in one atomic step; False (nothing done) where the platform cannot."""
    call = _exchange_call()
    if call is None:
        return False
    if call(os.fsencode(a), os.fsencode(b)) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@functools.cache
def _warn_no_exchange(directory: pathlib.Path) -> None:
    log.warning(
        "the filesystem of %s cannot exchange two directories atomically: a sharded save swaps with two renames, and "
        "one killed between them leaves no checkpoint at the path (engine.load and ampkit.checkpoint_exists find the "
        "complete copy beside it; path.exists() does not).", directory,
    )


def swap_into_place(tmp: pathlib.Path, target: pathlib.Path, token: str) -> None:
    """Make the finished directory ``tmp`` the checkpoint at ``target``; ``target`` is never half of either, and
    where the platform exchanges directories atomically it is never absent either."""
    if not target.exists():
        os.replace(tmp, target)  # nothing to lose: one rename
    elif _exchange(tmp, target):
        # One step: target is the new checkpoint, tmp the old one. A kill before the deletion below leaves the old
        # one at the .tmp name, which the next save removes.
        _fsync_directory(target.parent)
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
        return
    else:
        _warn_no_exchange(target.parent)
        old = target.with_name(f"{target.name}.{token}.old")
        os.replace(target, old)
        # A crash here leaves no target, but tmp and old both complete: find_checkpoint picks the newer one.
        os.replace(tmp, target)
        _fsync_directory(target.parent)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
        return
    _fsync_directory(target.parent)


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
