"""Exact save/resume of a training run driven by an :class:`~ampkit.training.Engine`.

A checkpoint holds the models, optimizers, schedulers, the engine's counters, the loss scaler, the fp32
master weights (Apex lost them, so O2 resumes spiked), gradients pending in an unfinished accumulation
window, and every RNG.

Loading is all or nothing. The whole payload is validated against the running setup first, types and shapes
included (:mod:`ampkit.checkpoint._checks`); then it is applied under an :class:`~ampkit.checkpoint._payload.Undo`
that puts everything back if the load fails part-way. The payload itself is built and applied in
:mod:`ampkit.checkpoint._payload`; this module writes it to one file, or hands it to
:mod:`ampkit.checkpoint._sharded` under a distributed strategy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._errors import CheckpointError
from ..fileio._checkpoint_files import load_checkpoint, save_checkpoint
from ._checks import check_training_payload
from ._file_kind import not_a_checkpoint
from ._payload import apply_training_payload, engine_state, load_engine_state, training_payload

if TYPE_CHECKING:
    from ..training._engine_protocol import EngineLike

__all__ = [
    "engine_state",
    "load_engine_state",
    "training_payload",
    "check_training_payload",
    "apply_training_payload",
    "checkpoint_exists",
    "save_training_state",
    "load_training_state",
]


def save_training_state(engine: EngineLike, path: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> None:
    """Write everything needed to resume ``engine``'s run bitwise-exactly, atomically, to ``path``.

    Under a distributed strategy every rank must call it: see :mod:`ampkit.checkpoint._sharded`.
    """
    if engine.strategy is not None:
        from ._sharded import save_distributed

        save_distributed(engine, path, extra)
        return
    save_checkpoint(training_payload(engine, extra), path)


def checkpoint_exists(path: str | os.PathLike[str]) -> bool:
    """Whether :meth:`Engine.load` finds a checkpoint for ``path``: the file or directory, or the complete copy
    that a sharded save killed while swapping it into place left beside it.

    >>> import tempfile, pathlib
    >>> checkpoint_exists(pathlib.Path(tempfile.mkdtemp()) / "last.pt")
    False
    """
    from ._sharded_dir import find_checkpoint

    return find_checkpoint(path) is not None


def load_training_state(engine: EngineLike, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Restore what :func:`save_training_state` wrote. Validates everything first; on error nothing changes.

    A checkpoint written by a distributed run (a DDP file, an FSDP directory) loads here too, on any world
    size torch can reshard to; see :mod:`ampkit.checkpoint._sharded`.
    """
    if not engine.models:
        raise RuntimeError("engine.load() called before engine.setup(); set up the same model and optimizers first.")
    from ._sharded_dir import find_checkpoint

    found = find_checkpoint(path)
    if engine.strategy is not None or (found is not None and found.is_dir()):
        from ._sharded import load_distributed

        return load_distributed(engine, path)
    try:
        payload = load_checkpoint(path, map_location="cpu")
    except CheckpointError as e:
        raise not_a_checkpoint(path) or e from e.__cause__
    check_training_payload(engine, payload, path)
    ranks = payload.get("ranks")
    if ranks is not None and ranks["world_size"] > 1 and payload["engine"]["pending_grads"] is not None:
        raise CheckpointError(
            f"{path} was saved by {ranks['world_size']} ranks inside an accumulation window, with gradients pending on each; "
            "resume it on the same number of ranks, or save at an accumulation boundary (engine.is_boundary)."
        )
    apply_training_payload(engine, payload)
    extra: dict[str, Any] | None = payload["extra"]  # as save() was given it
    return extra
