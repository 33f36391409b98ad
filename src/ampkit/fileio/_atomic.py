"""Files written atomically: a temporary file beside the target, renamed over it only once it is complete.

A reader of the target sees the old file or the new one, never half of one. Each temporary carries its writer's
pid, so a later write can tell the temporaries of a killed writer (stale, removed) from those of one still
running (left alone). :func:`ampkit.fileio.save_checkpoint` adds the fsync and the checkpoint envelope on top.

It imports nothing from ampkit, so that every layer can write files this way without loading another.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import secrets
from typing import Any

__all__ = ["remove_stale_temporaries", "write_text_atomic"]

_logger = logging.getLogger("ampkit")


def _as_path(path: str | os.PathLike) -> pathlib.Path:
    # os.fspath first so that a bytes path or a wrong type fails with Python's own clear TypeError.
    return pathlib.Path(os.fspath(path))


def _fsync_directory(directory: pathlib.Path) -> None:
    """Flush a directory entry to disk so the rename itself survives a power loss (best effort)."""
    # os.replace is atomic, but the new directory entry lives in the directory's own metadata, which the
    # kernel may still hold in memory. Windows cannot open a directory this way (and does not need to), and
    # some network file systems refuse fsync on directories: there the rename is as durable as the platform
    # allows, so a failure here is not an error.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _open_temp_file(target: pathlib.Path) -> tuple[pathlib.Path, Any]:
    """Create and open a fresh temporary file next to ``target``: ``<name>.<pid>-<random>.tmp``."""
    # Same directory as the target, because os.replace is only atomic within one file system. Mode "xb"
    # (O_EXCL) never reuses an existing file, and unlike tempfile.mkstemp (always 0600) it lets the process
    # umask decide the permissions, so the checkpoint gets the same mode as any other file the user writes.
    # The writer's pid in the name tells a later save whether the file belongs to a save still running.
    while True:
        temp = target.with_name(f"{target.name}.{os.getpid()}-{secrets.token_hex(8)}.tmp")
        try:
            return temp, open(temp, "xb")
        except FileExistsError:  # pragma: no cover - 64 random bits colliding
            continue


# A temporary of _open_temp_file; versions before the pid was added wrote "<name>.<16 hex>.tmp".
_TEMP_SUFFIX = re.compile(r"\.(?:(\d+)-)?[0-9a-f]{16}\.tmp")


def _writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # this process's own saves clean up after themselves; one found here is still running
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's; anything else: do not guess
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[pathlib.Path]:
    """Delete temporaries that saves to ``path`` left when they were killed mid-write; return what was removed.

    A save that raises removes its own temporary, but one killed outright (SIGKILL, the OOM killer, a lost
    node) cannot, and each such file is a whole checkpoint's size. A temporary whose writing process no longer
    exists on this machine is stale; one of a running process (this one included) is left alone, so two
    processes saving the same path do not break each other. :func:`save_checkpoint` calls this after each save.

    >>> import tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "last.pt"
    >>> _ = (target.parent / "last.pt.4194305-0123456789abcdef.tmp").write_bytes(b"cut off")  # pid beyond pid_max
    >>> [p.name for p in remove_stale_temporaries(target)]
    ['last.pt.4194305-0123456789abcdef.tmp']
    """
    target = _as_path(path)
    removed = []
    try:
        candidates = [p for p in target.parent.iterdir() if p.name.startswith(target.name + ".")]
    except OSError:
        return removed
    for candidate in candidates:
        found = _TEMP_SUFFIX.fullmatch(candidate.name[len(target.name):])
        if found is None or (found.group(1) is not None and _writer_alive(int(found.group(1)))):
            continue
        try:
            candidate.unlink()
            removed.append(candidate)
        except OSError as exc:  # not ours to delete, already gone: worth a word, never a failed save
            _logger.warning("could not remove %s left by an interrupted save: %s", candidate, exc)
    if removed:
        _logger.info("removed %d temporary file(s) that killed saves to %s left behind", len(removed), target)
    return removed


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` through a temporary file renamed over it.

    A reader sees the old file or the new one, never half of one; two writers of the same directory cannot
    trample each other's temporary file; the file gets the permissions the umask gives any other file.

    >>> import tempfile
    >>> p = write_text_atomic(pathlib.Path(tempfile.mkdtemp()) / "report.md", "# hi\\n"); p.read_text()
    '# hi\\n'
    """
    target = _as_path(path)
    temp: pathlib.Path | None = None
    try:
        temp, handle = _open_temp_file(target)
        with handle:
            handle.write(text.encode("utf-8"))
        os.replace(temp, target)
        temp = None
    finally:
        if temp is not None:
            temp.unlink(missing_ok=True)
    return target
