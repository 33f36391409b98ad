"""Safe, atomic checkpoint files and RNG state capture.

A training run that dies while writing a checkpoint must not take the previous checkpoint with it, and a
checkpoint downloaded from somewhere else must not be able to run code when loaded. This module gives both:

* :func:`save_checkpoint` writes to a temporary file next to the target and renames it into place only once
  the bytes are on disk, so the file at ``path`` is always either the old checkpoint or the new one.
* :func:`load_checkpoint` always loads with ``torch.load(weights_only=True)`` and turns every way a file can be
  wrong into one :class:`~ampkit.errors.CheckpointError` that names the file and says what to do.
* :func:`capture_rng_state` / :func:`restore_rng_state` snapshot every global random generator a training
  loop typically draws from, in a form that itself survives ``weights_only`` loading, so a resumed run
  continues the same random stream.
"""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import random
import re
import secrets
import zipfile
from typing import Any

import torch

from .errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "capture_rng_state", "restore_rng_state", "write_text_atomic"]

_logger = logging.getLogger("ampkit")

# The envelope every ampkit checkpoint is wrapped in. The marker lets load_checkpoint tell an ampkit checkpoint
# from any other torch file, and the version lets a future ampkit change the layout without older releases
# silently misreading it.
_FORMAT = "ampkit-checkpoint"
_FORMAT_VERSION = 1


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
    """Create and open a fresh temporary file next to ``target``: ``<name>.<random>.tmp``."""
    # Same directory as the target, because os.replace is only atomic within one file system. Mode "xb"
    # (O_EXCL) never reuses an existing file, and unlike tempfile.mkstemp (always 0600) it lets the process
    # umask decide the permissions, so the checkpoint gets the same mode as any other file the user writes.
    while True:
        temp = target.with_name(f"{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            return temp, open(temp, "xb")
        except FileExistsError:  # pragma: no cover - 64 random bits colliding
            continue


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


def save_checkpoint(state: dict, path: str | os.PathLike) -> pathlib.Path:
    """Write ``state`` to ``path`` atomically and return the path written.

    The file at ``path`` is replaced only once the new checkpoint is completely on disk: if anything fails
    (an exception, a ``KeyboardInterrupt``, a full disk), the previous file is left byte-identical and no
    temporary file is left behind. Missing parent directories are created.

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

    envelope = {"format": _FORMAT, "format_version": _FORMAT_VERSION, "payload": state}
    temp: pathlib.Path | None = None
    try:
        temp, handle = _open_temp_file(target)
        with handle:
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
            raise CheckpointError(
                f"Could not write checkpoint {target}: {type(exc).__name__}: {exc}. The previous checkpoint at "
                f"{target} is untouched."
            ) from exc
        raise
    _fsync_directory(target.parent)
    return target


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
            objects, is not an ampkit checkpoint, or was written by a newer ampkit.
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
        # RuntimeError: torch's zip reader ("failed finding central directory", bad CRC, missing records);
        # EOFError / KeyError / ValueError: a pickle stream or record table that ends or points nowhere.
        raise _corrupt(source, _first_sentence(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read checkpoint {source}: {exc}; check the file and its permissions.") from exc

    if not isinstance(loaded, dict) or loaded.get("format") != _FORMAT:
        raise CheckpointError(
            f"{source} is a PyTorch file but not an ampkit checkpoint (it has no 'format': {_FORMAT!r} marker); "
            f"load it with torch.load directly, or write it with ampkit.state.save_checkpoint."
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


def _numpy() -> Any:
    # NumPy is optional here: a training loop without it has no NumPy generator state to save.
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency of ampkit, but stay usable without it
        return None
    return numpy


def capture_rng_state() -> dict:
    """Snapshot the global random generators: torch CPU, every CUDA device, Python ``random``, NumPy.

    The result holds only tensors, lists and plain values, so it can be stored with :func:`save_checkpoint`
    and read back by :func:`load_checkpoint`. NumPy's part covers the legacy global ``np.random`` functions,
    not ``np.random.Generator`` objects, which the caller owns.

    >>> import torch
    >>> state = capture_rng_state()
    >>> first = torch.rand(3)
    >>> restore_rng_state(state)
    >>> torch.equal(torch.rand(3), first)
    True
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    # random.getstate() is (version, tuple of 625 ints, gauss_next); weights_only loading accepts lists but
    # the restore needs the tuple back, so store a list and rebuild the tuple in restore_rng_state.
    version, internal, gauss_next = random.getstate()
    state["python"] = [version, list(internal), gauss_next]
    np = _numpy()
    if np is not None:
        # ("MT19937", uint32 keys[624], pos, has_gauss, cached_gaussian): a NumPy array would be refused by
        # weights_only loading, so the keys travel as an int64 tensor (uint32 fits exactly) and the scalars
        # as Python ints and floats.
        name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
        state["numpy"] = {
            "bit_generator": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    return state


def restore_rng_state(state: dict) -> None:
    """Restore generators from a :func:`capture_rng_state` snapshot, so the next draws repeat exactly.

    Generators missing from ``state`` are left alone. CUDA states on a machine without CUDA (or NumPy state
    without NumPy) are skipped with a warning on the ``"ampkit"`` logger; the other generators are restored.

    >>> import random
    >>> state = capture_rng_state()
    >>> first = random.random()
    >>> restore_rng_state(state)
    >>> random.random() == first
    True

    Raises:
        CheckpointError: ``state`` is not a snapshot from :func:`capture_rng_state`.
    """
    known = {"torch", "cuda", "python", "numpy"}
    if not isinstance(state, dict) or not known & state.keys():
        raise CheckpointError(
            "restore_rng_state got something that is not an RNG snapshot (expected a dict with keys among "
            f"{sorted(known)}); pass the dict returned by capture_rng_state."
        )
    # Each generator is parsed before any is set, so a malformed snapshot fails without leaving the
    # generators half restored.
    try:
        torch_state = state["torch"].to("cpu", torch.uint8) if "torch" in state else None
        python_state = None
        if "python" in state:
            version, internal, gauss_next = state["python"]
            python_state = (int(version), tuple(int(x) for x in internal), gauss_next)
        cuda_states = [s.to("cpu", torch.uint8) for s in state["cuda"]] if "cuda" in state else None
    except (AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"restore_rng_state got a malformed RNG snapshot ({exc}); pass the dict returned by capture_rng_state."
        ) from exc

    np = _numpy() if "numpy" in state else None
    numpy_state = None
    if "numpy" in state and np is None:  # pragma: no cover - numpy is a dependency of ampkit
        _logger.warning("The RNG snapshot holds a NumPy state but NumPy is not installed; NumPy was not restored.")
    elif np is not None:
        saved = state["numpy"]
        try:
            keys = saved["keys"]
            keys = keys.cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
            numpy_state = (
                str(saved["bit_generator"]),
                keys.astype(np.uint32),
                int(saved["pos"]),
                int(saved["has_gauss"]),
                float(saved["cached_gaussian"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"restore_rng_state got a malformed NumPy RNG state ({exc}); pass the dict returned by "
                f"capture_rng_state."
            ) from exc

    if torch_state is not None:
        torch.set_rng_state(torch_state)
    if python_state is not None:
        random.setstate(python_state)
    if numpy_state is not None:
        np.random.set_state(numpy_state)
    if cuda_states is not None:
        if not torch.cuda.is_available():
            _logger.warning(
                "The RNG snapshot holds %d CUDA generator state(s) but CUDA is not available here; restored the "
                "CPU, Python and NumPy generators only, so GPU random draws will differ from the original run.",
                len(cuda_states),
            )
        else:
            count = torch.cuda.device_count()
            if len(cuda_states) != count:
                _logger.warning(
                    "The RNG snapshot holds %d CUDA generator state(s) but %d CUDA device(s) are visible; restored "
                    "the first %d.",
                    len(cuda_states),
                    count,
                    min(count, len(cuda_states)),
                )
            for index, cuda_state in enumerate(cuda_states[:count]):
                torch.cuda.set_rng_state(cuda_state, index)
