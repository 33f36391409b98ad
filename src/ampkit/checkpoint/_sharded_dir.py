"""Putting a sharded checkpoint directory in place atomically, and finding it again after a crash mid-swap.

A save writes ``<path>.<token>.tmp``, then exchanges it with the old checkpoint in one atomic step (Linux's
``renameat2(RENAME_EXCHANGE)``, macOS's ``renamex_np(RENAME_SWAP)``) and deletes the old one, now at the
``.tmp`` name: ``<path>`` holds a complete checkpoint, the old or the new, at every instant, whatever is killed
when. Where no exchange exists (Windows, a filesystem that refuses it, such as some network mounts; a warning says
so once), a directory cannot be renamed over a non-empty one, so the swap is two renames: the old checkpoint aside
to ``<path>.<token>.old``, the new one to ``<path>``. A process killed between them leaves no ``<path>`` at all,
but two complete checkpoints beside it: :func:`find_checkpoint` returns the newest complete one, so a resumed run
that loads through ampkit (``engine.load``, ``checkpoint_exists``) finds it; ``path.exists()`` does not.

The token names the writer as :mod:`ampkit.fileio._temporaries` names a temporary file's
(``<pid>-<start>-<machine>-<16 hex>``; rank 0's, on every rank of a job), so the next save removes, before it writes,
exactly what killed saves left (:func:`remove_leftovers`): never a directory of a save still running, never a name of
another form (``ckpt.notes.tmp``, ``ckpt.backup.old``). An earlier ampkit's ``<path>.<12 hex>.tmp`` names no writer:
it goes once nothing in it has been written to for an hour. Where the path is missing (killed between the renames),
the newest complete copy is renamed back into place first: the clean-up never removes the only checkpoint there is.

    >>> import tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("ckpt.4194305-0-0000abcd-0123456789abcdef.old", "ckpt.4194305-0-0000abcd-fedcba9876543210.tmp"):
    ...     (root / name).mkdir(); (root / name / ".metadata").touch()
    >>> (root / "ckpt.4194305-0-0000abcd-0123456789abcdef.old" / "ampkit.pt").touch()
    >>> find_checkpoint(root / "ckpt").name  # the .tmp lacks ampkit.pt: its save never finished
    'ckpt.4194305-0-0000abcd-0123456789abcdef.old'
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import pathlib
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable

from .._util.units import fmt_bytes
from ..fileio._checkpoint_files import _fsync_directory
from ..fileio._temporaries import STALE_AFTER_S, WRITER_TOKEN, is_stale

__all__ = ["ENGINE_FILE", "swap_into_place", "find_checkpoint", "remove_leftovers", "is_complete"]

log = logging.getLogger("ampkit")

ENGINE_FILE = "ampkit.pt"
"""Inside a sharded checkpoint directory: everything that is not a model or optimizer shard; written last."""


def is_complete(directory: pathlib.Path) -> bool:
    """Whether ``directory`` holds a finished sharded checkpoint (DCP's ``.metadata`` and ampkit's own file)."""
    return (directory / ".metadata").is_file() and (directory / ENGINE_FILE).is_file()


# What follows "<name>" in a save's own directories: the writer's token (or an earlier ampkit's 12 hex), then
# .tmp (being written, or the old checkpoint after the exchange) or .old (set aside by the two renames).
_LEFTOVER_SUFFIX = re.compile(rf"\.(?:{WRITER_TOKEN}|[0-9a-f]{{12}})\.(?:tmp|old)")


def _leftovers(target: pathlib.Path) -> list[tuple[pathlib.Path, re.Match[str]]]:
    """The saves' own names beside ``target`` and what their names say of the writer; nothing else that is there."""
    try:
        names = sorted(p for p in target.parent.iterdir() if p.name.startswith(target.name + "."))
    except OSError:  # no directory yet, or not readable: nothing of ours to find
        return []
    found = ((p, _LEFTOVER_SUFFIX.fullmatch(p.name, len(target.name))) for p in names)
    return [(p, match) for p, match in found if match is not None]


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
    newest = _newest_complete([p for p, _ in _leftovers(target)])
    if newest is None:
        return None
    log.warning("no checkpoint at %s: a save was interrupted while swapping it into place; loading %s, its newest complete copy.", target, newest)
    return newest


def _newest_complete(paths: list[pathlib.Path]) -> pathlib.Path | None:
    complete = [p for p in paths if p.is_dir() and is_complete(p)]
    # ampkit.pt is written after every shard and .metadata: the newest one belongs to the newest finished save.
    return max(complete, key=lambda p: (p / ENGINE_FILE).stat().st_mtime_ns, default=None)


def _last_write_and_size(path: pathlib.Path) -> tuple[float, int] | None:
    """When anything in ``path`` (a file, or a directory and all under it) was last written, and its bytes; None:
    not a plain file or directory (a link is never ours)."""
    info = path.lstat()
    if stat.S_ISREG(info.st_mode):
        return info.st_mtime, info.st_size
    if not stat.S_ISDIR(info.st_mode):
        return None
    # A running save writes its shards' bytes into files that already exist: only their times move, not the folder's.
    newest, size = info.st_mtime, 0
    for folder, _, files in os.walk(path):
        for name in files:
            found = os.lstat(os.path.join(folder, name))
            newest, size = max(newest, found.st_mtime), size + found.st_size
    return newest, size


def _delete(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        # ampkit.pt first (it was written last): a deletion cut short leaves a directory no loader takes for complete.
        (path / ENGINE_FILE).unlink(missing_ok=True)
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_leftovers(target: str | os.PathLike[str], *, stale_after: float = STALE_AFTER_S) -> list[pathlib.Path]:
    """Delete what killed saves to ``target`` left (mid-write or mid-swap); return what was removed.

    A save calls it before it writes, so the space is free for it. Only the saves' own names count, and of them only
    a killed save's: its writer ran on this machine and is gone (or its pid now names another process), or its writer
    cannot be checked from here (another machine's, an earlier ampkit's) and nothing in it has been written to for
    ``stale_after`` seconds. Where ``target`` is missing (killed between the swap's two renames), the newest complete
    copy is renamed back into place rather than removed. One line in the ``ampkit`` log names what was removed and its
    size; what cannot be removed gets a warning, never an error.

    >>> import os, tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "ckpt"
    >>> killed = target.with_name("ckpt.0123456789ab.tmp")  # an earlier ampkit's, nothing written in it for two hours
    >>> killed.mkdir(); os.utime(killed, (time.time() - 7200,) * 2)
    >>> target.with_name("ckpt.notes.tmp").mkdir()  # a user's
    >>> [p.name for p in remove_leftovers(target)]
    ['ckpt.0123456789ab.tmp']

    Raises:
        ValueError: ``stale_after`` is negative or not a number.
    """
    if not stale_after >= 0:  # also refuses NaN
        raise ValueError(f"stale_after={stale_after!r}: give the seconds without a write after which a leftover is stale, >= 0.")
    target = pathlib.Path(os.fspath(target))
    now = time.time()
    stale: dict[pathlib.Path, int] = {}
    leftovers = _leftovers(target)
    for path, writer in leftovers:
        try:
            found = _last_write_and_size(path)
        except OSError:
            continue  # removed meanwhile (its writer finished), or not ours to read
        if found is not None and is_stale(writer, found[0], now, stale_after):
            stale[path] = found[1]
    if not target.exists():
        # Killed between the two renames: the newest complete copy is the checkpoint; a running save's is left to it.
        newest = _newest_complete([p for p, _ in leftovers])
        if newest is not None and stale.pop(newest, None) is not None:
            try:
                os.replace(newest, target)
                _fsync_directory(target.parent)
                log.warning("no checkpoint at %s: a save was killed while swapping it into place; %s, its newest complete copy, is back at the path.", target, newest.name)
            except OSError as exc:
                log.warning("could not move %s back to %s: %s", newest, target, exc)
    removed: list[tuple[pathlib.Path, int]] = []
    for path, size in stale.items():
        try:
            _delete(path)
        except FileNotFoundError:
            continue  # its writer (or another cleaner) removed it meanwhile
        except OSError as exc:  # another user's files, a read-only mount: worth a word, never a failed save
            log.warning("could not remove %s, left by an interrupted save: %s", path, exc)
            continue
        removed.append((path, size))
    if removed:
        log.info(
            "removed %d leftover(s) of killed sharded saves to %s (%s): %s",
            len(removed), target, fmt_bytes(sum(size for _, size in removed)),
            ", ".join(f"{p.name} ({fmt_bytes(size)})" for p, size in removed),
        )
    return [p for p, _ in removed]
