"""Safe, atomic checkpoint files and RNG state capture.

A training run that dies while writing a checkpoint must not take the previous checkpoint with it, and a
checkpoint downloaded from somewhere else must not be able to run code when loaded. This module gives both:

* :func:`save_checkpoint` writes to a temporary file next to the target and renames it into place only once
  the bytes are on disk, so the file at ``path`` is always either the old checkpoint or the new one.
* :func:`load_checkpoint` always loads with ``torch.load(weights_only=True)`` and turns every way a file can be
  wrong into one :class:`~ampkit.CheckpointError` that names the file and says what to do.
* :func:`capture_rng_state` / :func:`restore_rng_state` (defined in :mod:`ampkit.fileio._rng`, exported here too)
  snapshot every global random generator a training loop draws from, so a resumed run continues the same
  random stream.
* :func:`write_text_atomic` / :func:`remove_stale_temporaries` (defined in :mod:`ampkit.fileio._atomic` and
  :mod:`ampkit.fileio._temporaries`, exported here too) write any file the same atomic way and clean up after
  writers that were killed.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import re
import zipfile

import torch

from .._errors import CheckpointError
from ._atomic import (
    _as_path,
    _fsync_directory,
    _open_temp_file,
    remove_stale_temporaries,
    write_text_atomic,
)
from ._checksums import crc32_on, verify_zip_records
from ._disk import full_disk_message, storage_bytes
from ._rng import capture_rng_state, check_rng_state, restore_rng_state

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "capture_rng_state",
    "check_rng_state",
    "restore_rng_state",
    "write_text_atomic",
    "remove_stale_temporaries",
]

# The envelope every ampkit checkpoint is wrapped in. The marker lets load_checkpoint tell an ampkit checkpoint
# from any other torch file, and the version lets a future ampkit change the layout without older releases
# silently misreading it.
_FORMAT = "ampkit-checkpoint"
_FORMAT_VERSION = 1


def save_checkpoint(state: dict, path: str | os.PathLike) -> pathlib.Path:
    """Write ``state`` to ``path`` atomically and return the path written.

    The file at ``path`` is replaced only once the new checkpoint is completely on disk: if anything fails
    (an exception, a ``KeyboardInterrupt``, a full disk, which the error names with the space needed and free),
    the previous file is left byte-identical and no
    temporary file is left behind. Temporaries that earlier saves to ``path`` left when they were killed outright
    are removed first, so their space is free for this one; those of saves still running (in any process, on any
    node) are kept (:func:`remove_stale_temporaries`). Missing parent directories are created.

    ``state`` should hold only tensors, plain containers (dict, list, tuple) and plain values (int, float,
    str, bool, None): :func:`load_checkpoint` refuses anything else for safety.

    >>> import tempfile, torch
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "run" / "last.pt"
    >>> save_checkpoint({"step": 10, "weight": torch.ones(2)}, target) == target
    True
    >>> load_checkpoint(target)["step"]
    10

    Raises:
        CheckpointError: ``path`` is a directory, or the checkpoint could not be written.
        TypeError: ``state`` is not a dict.
    """
    if not isinstance(state, dict):
        raise TypeError(f"save_checkpoint expects a dict as state, got {type(state).__name__}; wrap it in a dict.")
    target = _as_path(path)
    if target.is_dir():
        raise CheckpointError(
            f"Cannot write a checkpoint to {target}: it is a directory; pass a file path such as "
            f"{target / 'checkpoint.pt'}."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"Cannot create the directory {target.parent} for checkpoint {target}: {exc}; check the path and "
            f"its permissions."
        ) from exc

    # Before writing: a disk that killed saves filled up is the disk this save needs.
    remove_stale_temporaries(target)
    envelope = {"format": _FORMAT, "format_version": _FORMAT_VERSION, "payload": state}
    temp: pathlib.Path | None = None
    try:
        temp, handle = _open_temp_file(target)
        with handle, crc32_on():  # every record's CRC-32, which load_checkpoint verifies
            torch.save(envelope, handle)
            # flush moves Python's buffer to the OS, fsync moves the OS cache to the disk: only then may the
            # rename below make this file the checkpoint, or a crash could leave a renamed but empty file.
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
        temp = None  # renamed into place: nothing left to clean up
    except BaseException as exc:
        # BaseException on purpose: a Ctrl-C in the middle of torch.save must not leave a half-written
        # "<name>.*.tmp" file behind either.
        if temp is not None:
            try:
                temp.unlink(missing_ok=True)
            except OSError:  # pragma: no cover - nothing better to do; the real error matters more
                pass
        if isinstance(exc, Exception) and not isinstance(exc, CheckpointError):
            # After the temporary is gone, so the free space named is what the next try has.
            full = full_disk_message(exc, target.parent, storage_bytes(state))
            if full is not None:
                raise CheckpointError(
                    f"Could not write checkpoint {target}: {full}. Free space there or save elsewhere; the previous "
                    f"checkpoint at {target} is untouched."
                ) from exc
            raise CheckpointError(
                f"Could not write checkpoint {target}: {type(exc).__name__}: {exc}. The previous checkpoint at "
                f"{target} is untouched."
            ) from exc
        raise
    _fsync_directory(target.parent)
    return target


# How torch.load starts its error for a storage saved on a device that is missing here (CUDA unavailable, or
# fewer GPUs than the saving machine had).
_MISSING_DEVICE = "Attempting to deserialize object on"

# torch's message for a pickle global that weights_only refuses, e.g. "Unsupported global: GLOBAL mod.Cls ...".
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _first_sentence(exc: BaseException) -> str:
    # torch's messages run to paragraphs (and the weights_only one suggests weights_only=False, exactly the
    # wrong advice for a damaged or untrusted file), so quote only the first sentence.
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    return text.splitlines()[0].split(". ")[0].rstrip(".")[:200]


def _corrupt(path: pathlib.Path, detail: str) -> CheckpointError:
    return CheckpointError(
        f"Checkpoint {path} is truncated or corrupt ({detail}); it was probably cut off while being written or "
        f"copied, so load an earlier checkpoint or copy the file again."
    )


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device | None = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint` and return the ``state`` dict that was saved.

    The file is always loaded with ``torch.load(weights_only=True)``, so a checkpoint from an untrusted
    source cannot run code: only tensors, plain containers and plain values are accepted. ``map_location``
    is passed to ``torch.load`` (default ``"cpu"``, so a GPU checkpoint loads on any machine).

    >>> import tempfile, torch
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "ckpt.pt"
    >>> _ = save_checkpoint({"weight": torch.arange(3)}, target)
    >>> load_checkpoint(target)["weight"]
    tensor([0, 1, 2])

    Raises:
        CheckpointError: the file is missing, a directory, truncated or corrupt, holds arbitrary Python
            objects, is not an ampkit checkpoint, was written by a newer ampkit, or ``map_location`` leaves
            tensors on a device this machine lacks.
    """
    source = _as_path(path)
    if source.is_dir():
        raise CheckpointError(
            f"Cannot load checkpoint {source}: it is a directory; pass the checkpoint file inside it instead."
        )
    if not source.exists():
        raise CheckpointError(f"Checkpoint {source} does not exist; check the path (and the working directory).")
    # torch.save has written zip archives since torch 1.6, and save_checkpoint always does. Checking this first
    # turns truncated and garbage files into a clear "corrupt" error: torch.load would otherwise hand them to
    # the legacy unpickler, which reports them as a vague weights_only failure (and may emit warnings). torch
    # picks the zip reader by the leading "PK\x03\x04" magic, zipfile by the trailing directory: require both.
    try:
        with open(source, "rb") as handle:
            magic = handle.read(4)
        is_zip = magic == b"PK\x03\x04" and zipfile.is_zipfile(source)
    except OSError as exc:
        raise CheckpointError(f"Cannot read checkpoint {source}: {exc}; check its permissions.") from exc
    if not is_zip:
        raise _corrupt(source, "not a complete PyTorch zip archive")
    # Every record against its checksum before torch.load: torch's reader checks none, and a damaged tensor or
    # pickled value would otherwise load as a silently different one.
    verify_zip_records(source)

    try:
        loaded = torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        message = str(exc)
        # An opcode torch does not know means the pickle bytes themselves are damaged; every other
        # weights_only refusal means the file is well-formed but holds something other than plain data.
        if "Weights only load failed" in message and "Unsupported operand" not in message:
            found = _REFUSED_GLOBAL.search(message)
            what = f" (such as {found.group(1)})" if found else ""
            raise CheckpointError(
                f"Checkpoint {source} contains arbitrary Python objects{what} and was refused for safety, since "
                f"loading them could run code; ampkit checkpoints contain only tensors and plain containers, so "
                f"re-save it from plain data (for example a module's or optimizer's state_dict())."
            ) from exc
        raise _corrupt(source, "its pickled data is unreadable") from exc
    except (RuntimeError, EOFError, pickle.PickleError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        if isinstance(exc, RuntimeError) and _MISSING_DEVICE in str(exc):
            # A sound file whose tensors were saved on (or mapped to) a device this machine lacks, such as a GPU
            # checkpoint on a CPU-only machine: not damage, and copying the file again would not help.
            raise CheckpointError(
                f"Checkpoint {source} would put tensors on a device this machine lacks ({_first_sentence(exc)}); "
                f"load it with map_location='cpu' (the default; Engine.load always does), or name a device that "
                f"exists here, e.g. map_location='cuda:0'."
            ) from exc
        # RuntimeError: torch's zip reader ("failed finding central directory", bad CRC, missing records);
        # EOFError / KeyError / ValueError: a pickle stream or record table that ends or points nowhere.
        raise _corrupt(source, _first_sentence(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read checkpoint {source}: {exc}; check the file and its permissions.") from exc

    if not isinstance(loaded, dict) or loaded.get("format") != _FORMAT:
        raise CheckpointError(
            f"{source} is a PyTorch file but not an ampkit checkpoint (it has no 'format': {_FORMAT!r} marker); "
            f"load it with torch.load directly, or write it with ampkit.fileio.save_checkpoint."
        )
    version = loaded.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _corrupt(source, f"invalid format_version {version!r}")
    if version > _FORMAT_VERSION:
        raise CheckpointError(
            f"Checkpoint {source} has format_version {version}, newer than the {_FORMAT_VERSION} this ampkit "
            f"reads; upgrade ampkit to load it."
        )
    payload = loaded.get("payload")
    if not isinstance(payload, dict):
        raise _corrupt(source, f"payload is {type(payload).__name__}, not a dict")
    return payload
