"""Files written atomically: a temporary file beside the target, renamed over it only once it is complete.

A reader of the target sees the old file or the new one, never half of one. Each temporary is named for its writer,
so a later write can tell the temporaries of a killed writer (stale, removed) from those of one still running (left
alone): :mod:`ampkit.fileio._temporaries`. :func:`ampkit.fileio.save_checkpoint` adds the fsync and the checkpoint
envelope on top.

It imports nothing from ampkit but a formatter, so that every layer can write files this way without loading another.
"""

from __future__ import annotations

import os
import pathlib

# _open_temp_file is imported from here by the checkpoint writer (and patched there by tests); the stale-file rule
# is public from this module too, which an older path (ampkit._util.atomic_files) still names.
from ._temporaries import _open_temp_file, remove_stale_temporaries

__all__ = ["remove_stale_temporaries", "write_text_atomic"]


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


def write_text_atomic(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write ``text`` (UTF-8, ``\\n`` line ends) to ``path`` through a temporary file renamed over it.

    A reader sees the old file or the new one, never half of one; two writers of the same directory cannot
    trample each other's temporary file; the file gets the permissions the umask gives any other file. Temporaries
    that killed writes to ``path`` left behind are removed first (:func:`remove_stale_temporaries`).

    >>> import tempfile
    >>> p = write_text_atomic(pathlib.Path(tempfile.mkdtemp()) / "report.md", "# hi\\n"); p.read_text()
    '# hi\\n'
    """
    target = _as_path(path)
    remove_stale_temporaries(target)
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
