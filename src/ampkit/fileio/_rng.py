"""Snapshots of the global random generators, checked whole before any generator is set.

A resumed run must continue the same random stream (dropout masks, data order), so a checkpoint carries the
state of torch's CPU and CUDA generators, Python's ``random`` and NumPy's legacy global generator, in a form
that survives ``weights_only`` loading. Restoring parses every part first: a malformed snapshot raises
before a single generator changes, and :func:`check_rng_state` runs that check alone (a checkpoint load
validates everything before it changes anything).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import torch

from .._errors import CheckpointError

__all__ = ["capture_rng_state", "check_rng_state", "restore_rng_state"]

_logger = logging.getLogger("ampkit")

_MT_WORDS = 624  # Mersenne Twister state words, for Python's random and NumPy's legacy generator alike


def _numpy() -> Any:
    # NumPy is optional here: a training loop without it has no NumPy generator state to save.
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a dependency of ampkit, but stay usable without it
        return None
    return numpy


def capture_rng_state() -> dict:
    """Snapshot the global random generators: torch CPU, every CUDA device, Python ``random``, NumPy.

    The result holds only tensors, lists and plain values, so it can be stored with
    :func:`ampkit.fileio.save_checkpoint` and read back by :func:`ampkit.fileio.load_checkpoint`. NumPy's part
    covers the legacy global ``np.random`` functions, not ``np.random.Generator`` objects, which the caller owns.

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
    # the restore needs the tuple back, so store a list and rebuild the tuple when restoring.
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


def _malformed(part: str, detail: str) -> CheckpointError:
    return CheckpointError(
        f"the RNG snapshot's {part} state is malformed ({detail}); pass the dict returned by capture_rng_state, "
        "or a checkpoint written by Engine.save()."
    )


def _byte_state(value: Any, part: str, size: int | None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 1:
        raise _malformed(part, f"expected a 1-d byte tensor, got {type(value).__name__}")
    if size is not None and value.numel() != size:
        raise _malformed(part, f"{value.numel()} bytes, this torch's generator has {size}")
    return value.to("cpu", torch.uint8)


def _python_state(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _malformed("python", "expected [version, words, gauss_next]")
    version, internal, gauss_next = value
    if isinstance(version, bool) or not isinstance(version, int):
        raise _malformed("python", f"version {version!r}")
    if not isinstance(internal, (list, tuple)) or len(internal) != _MT_WORDS + 1:
        raise _malformed("python", f"expected {_MT_WORDS + 1} state words")
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in internal):
        raise _malformed("python", "state words must be integers in [0, 2**32)")
    if gauss_next is not None and not isinstance(gauss_next, float):
        raise _malformed("python", f"gauss_next {gauss_next!r}")
    return (version, tuple(internal), gauss_next)


def _numpy_state(value: Any, np: Any) -> tuple:
    try:
        keys = value["keys"]
        keys = keys.cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        parsed = (str(value["bit_generator"]), keys.astype(np.uint32), int(value["pos"]), int(value["has_gauss"]), float(value["cached_gaussian"]))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise _malformed("numpy", f"{type(exc).__name__}: {exc}") from exc
    if parsed[0] != "MT19937" or parsed[1].shape != (_MT_WORDS,) or not 0 <= parsed[2] <= _MT_WORDS:
        raise _malformed("numpy", f"generator {parsed[0]!r} with {parsed[1].size} keys at position {parsed[2]}")
    return parsed


def _parse(state: Any) -> list[Callable[[], None]]:
    """Every generator's setter, built only once the whole snapshot has been read without error."""
    known = {"torch", "cuda", "python", "numpy"}
    if not isinstance(state, dict) or not known & state.keys():
        raise CheckpointError(
            "restore_rng_state got something that is not an RNG snapshot (expected a dict with keys among "
            f"{sorted(known)}); pass the dict returned by capture_rng_state."
        )
    setters: list[Callable[[], None]] = []
    if "torch" in state:
        cpu = _byte_state(state["torch"], "torch", torch.get_rng_state().numel())
        setters.append(lambda: torch.set_rng_state(cpu))
    if "python" in state:
        python = _python_state(state["python"])
        setters.append(lambda: random.setstate(python))
    if "numpy" in state:
        np = _numpy()
        if np is None:  # pragma: no cover - numpy is a dependency of ampkit
            _logger.warning("The RNG snapshot holds a NumPy state but NumPy is not installed; NumPy was not restored.")
        else:
            numpy_state = _numpy_state(state["numpy"], np)
            setters.append(lambda: np.random.set_state(numpy_state))
    if "cuda" in state:
        if not isinstance(state["cuda"], (list, tuple)):
            raise _malformed("cuda", f"expected a list of byte tensors, got {type(state['cuda']).__name__}")
        size = torch.cuda.get_rng_state().numel() if torch.cuda.is_available() else None
        cuda_states = [_byte_state(s, "cuda", size) for s in state["cuda"]]
        setters.append(lambda: _set_cuda(cuda_states))
    return setters


def _set_cuda(cuda_states: list[torch.Tensor]) -> None:
    if not torch.cuda.is_available():
        _logger.warning(
            "The RNG snapshot holds %d CUDA generator state(s) but CUDA is not available here; restored the "
            "CPU, Python and NumPy generators only, so GPU random draws will differ from the original run.",
            len(cuda_states),
        )
        return
    count = torch.cuda.device_count()
    if len(cuda_states) != count:
        _logger.warning(
            "The RNG snapshot holds %d CUDA generator state(s) but %d CUDA device(s) are visible; restored the first %d.",
            len(cuda_states),
            count,
            min(count, len(cuda_states)),
        )
    for index, cuda_state in enumerate(cuda_states[:count]):
        torch.cuda.set_rng_state(cuda_state, index)


def check_rng_state(state: Any) -> None:
    """Raise :class:`~ampkit.CheckpointError` unless ``state`` restores cleanly; changes nothing.

    >>> check_rng_state(capture_rng_state())
    >>> check_rng_state({"torch": torch.zeros(3, dtype=torch.uint8)})
    Traceback (most recent call last):
    ampkit.CheckpointError: the RNG snapshot's torch state is malformed (3 bytes, this torch's generator has 5056); pass the dict returned by capture_rng_state, or a checkpoint written by Engine.save().
    """
    _parse(state)


def restore_rng_state(state: dict) -> None:
    """Restore generators from a :func:`capture_rng_state` snapshot, so the next draws repeat exactly.

    Generators missing from ``state`` are left alone. CUDA states on a machine without CUDA (or NumPy state
    without NumPy) are skipped with a warning on the ``"ampkit"`` logger; the other generators are restored.
    The whole snapshot is checked first: a malformed one raises and no generator changes.

    >>> import random
    >>> state = capture_rng_state()
    >>> first = random.random()
    >>> restore_rng_state(state)
    >>> random.random() == first
    True

    Raises:
        CheckpointError: ``state`` is not a snapshot from :func:`capture_rng_state`, or a part is malformed.
    """
    for set_generator in _parse(state):
        set_generator()
