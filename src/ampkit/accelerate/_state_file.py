"""The engine's state in a framework's checkpoint folder: ``ampkit_state.pt`` beside the framework's own files.

Accelerate's ``save_state`` folder and the Hugging Face Trainer's ``checkpoint-N`` folder hold the model, the
optimizer, the schedulers and the RNG; the engine adds what only it has (:meth:`ampkit.Engine.state_dict`: the loss
scaler, the fp32 master weights, the counters, bf16-true-sr's rounding stream). The file is written atomically
(:func:`ampkit.fileio.save_checkpoint`: a crash mid-write leaves the previous file or none, never half of one) and
read with ``torch.load(weights_only=True)`` after checking every record's checksum (:func:`ampkit.fileio.load_checkpoint`),
so a checkpoint folder from elsewhere cannot run code through it. Accelerate's ``register_for_checkpointing`` would
pickle the state as ``custom_checkpoint_<i>.pkl`` and load it with ``weights_only=False`` (always, in Accelerate
1.16), and its index would shift with the user's own registered objects: the engine's state has a file of its own.

A folder without the file was written without ampkit (a plain Trainer or Accelerator run): :func:`read_engine_state`
says what starts afresh (the loss scale at its initial value, master weights from the saved 16-bit weights), and
the run goes on from the framework's files.

    >>> import tempfile, torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> engine = Engine("16-mixed"); model = nn.Linear(2, 2)
    >>> model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    >>> folder = tempfile.mkdtemp(); path = write_engine_state(engine, folder)
    >>> path.name, read_engine_state(engine, folder)["policy"]
    ('ampkit_state.pt', '16-mixed')
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint._checks import check_engine_state
from ..fileio import load_checkpoint, save_checkpoint

if TYPE_CHECKING:
    from ..training import Engine

__all__ = ["STATE_FILE", "read_engine_state", "write_engine_state"]

log = logging.getLogger("ampkit")

STATE_FILE = "ampkit_state.pt"
"""The engine's file in a checkpoint folder."""


def write_engine_state(engine: Engine, folder: str | os.PathLike[str]) -> Path:
    """Write ``engine.state_dict()`` atomically to ``folder/ampkit_state.pt``; returns the path."""
    return save_checkpoint(engine.state_dict(), Path(folder) / STATE_FILE)


def read_engine_state(engine: Engine, folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The engine state saved in ``folder``, checked against ``engine`` (same policy, scaler, masters); None, with a
    warning naming what starts afresh, when the folder has none. Changes nothing: apply it with
    ``engine.load_state_dict(state)``. Raises :class:`~ampkit.CheckpointError` for a damaged or mismatched file."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        fresh = [what for what, there in (("the loss scale starts at its initial value", engine.scaler is not None),
                                          ("the fp32 master weights are taken from the saved 16-bit weights", engine.masters is not None)) if there]
        log.warning("%s has no %s (written without ampkit): resuming from the framework's files only%s.", folder, STATE_FILE,
                    f"; {' and '.join(fresh)}" if fresh else "")
        return None
    state = load_checkpoint(path)
    check_engine_state(engine, state)
    return state
