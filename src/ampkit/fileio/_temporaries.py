"""The temporary files of atomic writes: their names, and telling a killed writer's (stale) from a running one's.

A write puts its bytes in ``<name>.<pid>-<start>-<machine>-<random>.tmp`` beside the target, then renames it over
the target. A writer killed outright (SIGKILL, the OOM killer, a preempted node) leaves that file behind, a whole
checkpoint's size each time; the next write to the same target removes it, and never the file of a write still
running. The name carries what that decision needs:

* ``pid`` and ``start`` (when the writing process started, in clock ticks since boot, read from ``/proc``; 0 where
  the platform does not say): the pid alone does not name a process, since pids are reused, and a restarted
  container gives its training process the very pid of the one that was killed.
* ``machine``: 8 hex digits of a hash of the host name and the pid namespace. On a shared filesystem the ranks of
  other nodes (or other containers) write beside ours, and their pids mean nothing here.
* ``random``: two writes of one process (two threads) never share a name.

A temporary is stale when its writer ran on this machine and is gone (no process has its pid, the one that has it
started at another time, or it is a zombie), or when its writer cannot be checked from here (another machine, or a
name an older ampkit wrote) and the file has not been written to for ``stale_after`` seconds: a running save writes
continuously, so an hour without a byte is a save that died. A file whose name has not exactly this form
(``last.pt.notes``, ``last.pt.tmp.bak``) is never touched.

It imports nothing from ampkit but a formatter, so every layer can write files this way without loading another. The
sharded checkpoint's directories (:mod:`ampkit.checkpoint._sharded_dir`) are named and judged the same way, through
:func:`writer_token`, :data:`WRITER_TOKEN` and :func:`is_stale`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pathlib
import re
import secrets
import socket
import stat
import time
from typing import Any

from .._util.units import fmt_bytes

__all__ = ["remove_stale_temporaries", "writer_token", "WRITER_TOKEN", "is_stale"]

_logger = logging.getLogger("ampkit")

STALE_AFTER_S = 3600.0
"""Seconds without a write after which a temporary whose writer cannot be checked from here counts as stale."""

WRITER_TOKEN = r"(?P<pid>\d{1,10})-(?P<start>\d{1,20})-(?P<machine>[0-9a-f]{8})-[0-9a-f]{16}"
"""A token of :func:`writer_token` as a regular expression, its groups ``pid``, ``start`` and ``machine`` as
:func:`is_stale` reads them: other writers of ampkit (the sharded checkpoint's directories) name their work with it."""

# The suffix after "<name>": today's form, the previous release's "<pid>-<16 hex>" and the first "<16 hex>".
_TEMP_SUFFIX = re.compile(r"\.(?:(?P<pid>\d{1,10})-(?:(?P<start>\d{1,20})-(?P<machine>[0-9a-f]{8})-)?)?[0-9a-f]{16}\.tmp")


@functools.cache
def _machine() -> str:
    """This machine as the pids in a temporary's name know it: the host and the pid namespace, hashed short."""
    try:  # two containers on one host (with one host name) each number their processes from 1
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{namespace}".encode()).hexdigest()[:8]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``pid``'s state letter and start (clock ticks since boot) from ``/proc``; None where there is none to read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")". The start
        # is field 22 of the line, the 20th after comm.
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _own_start() -> int:
    found = _proc_stat(os.getpid())
    return 0 if found is None else found[1]


def writer_token() -> str:
    """A fresh ``<pid>-<start>-<machine>-<16 hex>`` naming this process as a writer (see the module's note).

    >>> import re
    >>> re.fullmatch(WRITER_TOKEN, writer_token())["pid"] == str(os.getpid())
    True
    """
    return f"{os.getpid()}-{_own_start()}-{_machine()}-{secrets.token_hex(8)}"


def _open_temp_file(target: pathlib.Path) -> tuple[pathlib.Path, Any]:
    """Create and open a fresh temporary file next to ``target``, named for its writer (see the module's note)."""
    # Same directory as the target, because os.replace is only atomic within one file system. Mode "xb"
    # (O_EXCL) never reuses an existing file, and unlike tempfile.mkstemp (always 0600) it lets the process
    # umask decide the permissions, so the checkpoint gets the same mode as any other file the user writes.
    while True:
        temp = target.with_name(f"{target.name}.{writer_token()}.tmp")
        try:
            return temp, open(temp, "xb")
        except FileExistsError:  # pragma: no cover - 64 random bits colliding
            continue


def _writer_gone(pid: int, start: int) -> bool | None:
    """Whether the process ``pid`` (started at ``start``, 0: unknown) of this machine has ended; None: cannot tell."""
    if os.name == "nt":
        return None  # os.kill(pid, 0) is no probe on Windows: it terminates the process
    try:
        os.kill(pid, 0)  # signal 0: an existence check only
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, another user's
    except (OSError, OverflowError):
        return True  # no pid this machine can have
    found = _proc_stat(pid)
    if found is None:
        return False  # it exists; without /proc (macOS) a reused pid cannot be told apart: keep the file
    state, started = found
    # A zombie writes nothing more; a process started at another time holds a reused pid, not the writer's.
    return state in ("Z", "X") or (start != 0 and started != start)


def is_stale(writer: re.Match[str], modified: float, now: float, stale_after: float) -> bool:
    """Whether what the writer named by ``writer`` left, last written at ``modified``, is a killed write's leftover.

    ``writer`` is a match whose groups ``pid``, ``start`` and ``machine`` (:data:`WRITER_TOKEN`) name the writer, or
    are absent or None where the name carries none (an older ampkit's). A writer of this machine is judged by its
    process alone (gone, a zombie, or its pid reused: stale; running: never), however old the file; any other only
    once nothing has been written for ``stale_after`` seconds (the times are :func:`time.time`'s).

    >>> import re, time
    >>> mine = re.fullmatch(WRITER_TOKEN, writer_token())
    >>> is_stale(mine, modified=0.0, now=time.time(), stale_after=60.0)  # this process runs: never stale
    False
    >>> older = re.fullmatch(r"[0-9a-f]{12}", "0123456789ab")  # no writer in the name: its age decides
    >>> is_stale(older, modified=0.0, now=30.0, stale_after=60.0), is_stale(older, modified=0.0, now=90.0, stale_after=60.0)
    (False, True)
    """
    groups = writer.groupdict()
    if groups.get("machine") == _machine():
        gone = _writer_gone(int(groups["pid"]), int(groups["start"]))
        if gone is not None:
            return gone
    # Written elsewhere, by an older ampkit, or not checkable here: only a file nobody has written to for long.
    return now - modified > stale_after


def remove_stale_temporaries(path: str | os.PathLike, *, stale_after: float = STALE_AFTER_S) -> list[pathlib.Path]:
    """Delete the temporaries that writes to ``path`` left when they were killed mid-write; return what was removed.

    A write that raises removes its own temporary, but one killed outright (SIGKILL, the OOM killer, a lost node)
    cannot, and each such file is a whole checkpoint's size. :func:`save_checkpoint` and :func:`write_text_atomic`
    call this before each write, so the space is free for it. A temporary of a write still running (in this process,
    another one, or on another node of a shared filesystem) is kept; one whose writer ran on this machine and is gone
    is removed at once; one whose writer cannot be checked from here (another machine's, an older ampkit's) once
    nothing has written to it for ``stale_after`` seconds (default an hour). Files named otherwise are never touched.
    One line in the ``ampkit`` log names what was removed and its size.

    >>> import tempfile, time
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "last.pt"
    >>> left = target.parent / "last.pt.0123456789abcdef.tmp"  # an older ampkit's, its writer unknown
    >>> _ = left.write_bytes(b"cut off"); os.utime(left, (time.time() - 7200,) * 2)  # untouched for two hours
    >>> _ = (target.parent / "last.pt.notes.tmp").write_text("a user's file")
    >>> [p.name for p in remove_stale_temporaries(target)]
    ['last.pt.0123456789abcdef.tmp']

    Raises:
        ValueError: ``stale_after`` is negative or not a number.
    """
    if not stale_after >= 0:  # also refuses NaN
        raise ValueError(f"stale_after={stale_after!r}: give the seconds without a write after which a temporary is stale, >= 0.")
    target = pathlib.Path(os.fspath(path))
    try:
        candidates = sorted(p for p in target.parent.iterdir() if p.name.startswith(target.name + "."))
    except OSError:  # no directory yet, or not readable: nothing of ours to find
        return []
    now = time.time()
    removed: list[tuple[pathlib.Path, int]] = []
    for candidate in candidates:
        suffix = _TEMP_SUFFIX.fullmatch(candidate.name, len(target.name))
        if suffix is None:
            continue
        try:
            info = candidate.lstat()
            if not stat.S_ISREG(info.st_mode) or not is_stale(suffix, info.st_mtime, now, stale_after):
                continue
            candidate.unlink()
        except FileNotFoundError:
            continue  # its writer renamed it into place (or another cleaner removed it) meanwhile
        except OSError as exc:  # not ours to delete: worth a word, never a failed save
            _logger.warning("could not remove %s, left by an interrupted save: %s", candidate, exc)
            continue
        removed.append((candidate, info.st_size))
    if removed:
        _logger.info(
            "removed %d temporary file(s) that killed saves to %s left behind (%s): %s",
            len(removed), target, fmt_bytes(sum(size for _, size in removed)),
            ", ".join(f"{p.name} ({fmt_bytes(size)})" for p, size in removed),
        )
    return [p for p, _ in removed]
