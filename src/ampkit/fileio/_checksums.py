"""Checksums of checkpoint files: a damaged byte is found before a checkpoint is used, never loaded silently.

A single-file checkpoint is a zip archive whose every record (``data.pkl``, the pickled structure and values: the
metadata; ``data/N``, one per tensor storage; the small format records) carries the CRC-32 that torch computes while
writing it, over the bytes in memory. torch's reader never checks them; :func:`verify_zip_records` does, with the
standard library's zip reader, before ``torch.load`` runs. A file whose records all carry 0 was written with torch's
CRC turned off (``torch.utils.serialization.config.save.compute_crc32 = False``) or by a writer without one: it
loads unverified, with a note in the log. :func:`crc32_on` keeps torch's CRC on while ampkit saves.

A sharded (DCP) checkpoint's shard files carry no checksum of their own: :func:`file_crc32` computes one per file
after the save (each rank its own files, read back from the page cache), kept in the directory's ``ampkit.pt``.

    >>> import io, tempfile, os, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "t.pt"); torch.save({"w": torch.ones(3)}, path)
    >>> verify_zip_records(path)
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import zipfile
import zlib
from collections.abc import Iterator

from .._errors import CheckpointError

__all__ = ["verify_zip_records", "crc32_on", "file_crc32"]

log = logging.getLogger("ampkit")

_CHUNK = 16 << 20


@contextlib.contextmanager
def crc32_on() -> Iterator[None]:
    """torch's per-record CRC-32 on while a checkpoint is written (the default; a user may have turned it off)."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # pragma: no cover - torch before the option: CRCs were always computed
        yield
        return
    previous = config.save.compute_crc32
    config.save.compute_crc32 = True
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


def verify_zip_records(path: str | os.PathLike[str]) -> bool:
    """Check every record of the zip archive at ``path`` against its CRC-32; True if checked, False if it has none.

    Raises:
        CheckpointError: a record's bytes do not match its checksum (named, with the file), or the archive's record
            table is unreadable.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            if records and all(r.CRC == 0 for r in records):
                log.info("%s carries no checksums (written with torch's CRC off); loaded without verifying its bytes", path)
                return False
            for record in records:
                with archive.open(record) as stream:  # zipfile compares the CRC when the record is read to its end
                    while stream.read(_CHUNK):
                        pass
    except zipfile.BadZipFile as exc:
        name = _record_named(str(exc))
        what = f"record {name} ({_meaning(name)}) does not match its checksum" if name else f"its record table is damaged ({exc})"
        raise CheckpointError(
            f"Checkpoint {path} is truncated or corrupt: {what}; the file was damaged on disk or in a copy, so load an "
            f"earlier checkpoint or copy the file again. Nothing was loaded."
        ) from exc
    except (OSError, ValueError, EOFError, NotImplementedError) as exc:  # UnicodeDecodeError: a damaged record name
        raise CheckpointError(
            f"Checkpoint {path} is truncated or corrupt: its records cannot be read ({type(exc).__name__}: {exc}); load "
            f"an earlier checkpoint or copy the file again. Nothing was loaded."
        ) from exc
    return True


def _record_named(message: str) -> str | None:
    # zipfile says "Bad CRC-32 for file 'archive/data/3'".
    if "for file" not in message:
        return None
    return message.split("for file", 1)[1].strip().strip("'\"")


def _meaning(name: str) -> str:
    tail = name.split("/", 1)[-1]
    if tail == "data.pkl":
        return "the metadata: the pickled structure and plain values"
    if tail.startswith("data/"):
        return f"tensor storage {tail.split('/', 1)[1]}"
    return "a format record"


def file_crc32(path: str | os.PathLike[str]) -> int:
    """CRC-32 of the whole file at ``path`` (zlib's, read in 16 MiB chunks).

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x")
    >>> with open(p, "wb") as f:
    ...     _ = f.write(b"123456789")
    >>> hex(file_crc32(p))
    '0xcbf43926'
    """
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
