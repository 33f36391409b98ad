"""Reading a sharded (DCP) checkpoint into a running model without ever leaving it half loaded.

torch.distributed.checkpoint loads *into* the tensors it is given, and the state dicts torch hands out share
storage with the parameters: a shard file that is missing or cut short, found only while reading, leaves the
model partly overwritten. So the load here is in three steps:

1. :func:`read_metadata` unpickles ``.metadata`` through an exact allow-list and checks that every shard file
   it names is present and long enough (a truncated copy is found before a byte is read);
2. :func:`load_shards` compares the metadata's entries and global shapes with this model's and optimizer's
   state (a sharded load has no other model check), reads the shards into fresh tensors, and turns DCP's
   ``CheckpointException`` (a ``BaseException``, which ``except Exception`` misses) into a CheckpointError;
3. only then are the fresh tensors copied into the model and optimizer, under the caller's undo snapshot.

The price is one more copy of this rank's shards while loading.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

from .._compat import flatten_state_dict, tree_map_only
from .._errors import CheckpointError, one_line
from ..fileio._checksums import file_crc32
from ..training._kernel_guards import guard_optimizer
from ._dcp_state import grouped, optimizer_owner, sharded_state, single_process_intended
from ._payload import lr_differs
from ._safe_dcp import SafeFileSystemReader, SafeLoadPlanner, storage_files

if TYPE_CHECKING:
    from ..training._engine_protocol import EngineLike

__all__ = ["verify_shards", "read_metadata", "load_shards"]

log = logging.getLogger("ampkit")


def verify_shards(directory: Path, checksums: dict[str, int] | None, rank: int = 0, world: int = 1) -> None:
    """Check the directory's files (``.metadata`` and every shard) against the CRC-32s its save kept in ampkit.pt.

    Each rank reads its share of the files (every ``world``-th, from ``rank``), so a load reads each file once more
    in all; the caller agrees the outcome across ranks. A directory saved before checksums loads unverified, with a
    note in the log.
    """
    if checksums is None:
        log.info("%s carries no shard checksums (saved by an older ampkit); loaded without verifying its bytes", directory)
        return
    for name in sorted(checksums)[rank::world]:
        path = directory / name
        try:
            actual = file_crc32(path)
        except OSError as exc:
            raise CheckpointError(f"{directory} is incomplete: {name} cannot be read ({exc}); copy the whole directory again or load an earlier checkpoint.") from exc
        if actual != checksums[name]:
            what = "the metadata" if name == ".metadata" else "a shard"
            raise CheckpointError(
                f"{directory} is corrupt: {name} ({what}) does not match its checksum; it was damaged on disk or in a "
                "copy. Copy the whole directory again or load an earlier checkpoint. Nothing was loaded."
            )


def read_metadata(directory: Path) -> Metadata:
    """The directory's DCP metadata, read safely, once every shard file it names is there whole."""
    metadata = SafeFileSystemReader(directory).read_metadata()
    short = []
    for name, needed in storage_files(metadata).items():
        try:
            size = os.stat(directory / name).st_size
        except FileNotFoundError:
            short.append(f"{name} (missing)")
            continue
        if size < needed:
            short.append(f"{name} ({size} of at least {needed} bytes)")
    if short:
        raise CheckpointError(
            f"{directory} is incomplete: shard files {short[:4]} are missing or truncated; it was cut off while being "
            "written or copied. Copy the whole directory again or load an earlier checkpoint."
        )
    return metadata


def _global_shape(value: Any) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _check_against(flat: dict[str, Any], metadata: Metadata, directory: Path) -> None:
    saved = metadata.state_dict_metadata
    for prefix, what in (("model.", "model"), ("optim.", "optimizer")):
        mine = {k for k in flat if k.startswith(prefix)}
        theirs = {k for k in saved if k.startswith(prefix)}
        missing, unexpected = sorted(mine - theirs), sorted(theirs - mine)
        wrong = []
        for key in sorted(mine & theirs):
            entry, shape = saved[key], _global_shape(flat[key])
            if isinstance(entry, TensorStorageMetadata) and shape is not None:
                if tuple(entry.size) != shape:
                    wrong.append(f"{key} {tuple(entry.size)} vs {shape}")
            elif not (isinstance(entry, BytesStorageMetadata) and shape is None):
                wrong.append(f"{key} (tensor vs value)")
        if missing or unexpected or wrong:
            fix = "Build the same model as the saved run" if what == "model" else "Build the optimizer the saved run used"
            raise CheckpointError(
                f"{directory}: the {what} does not match the checkpoint (missing {missing[:3]}, unexpected {unexpected[:3]}, "
                f"shape mismatch {wrong[:3]}). {fix} before engine.load()."
            )


def load_shards(engine: EngineLike, directory: Path, metadata: Metadata) -> None:
    """Read the shards into fresh tensors, then copy them into the engine's models and optimizers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = sharded_state(engine)
    flat, _ = flatten_state_dict(state)
    _check_against(flat, metadata, directory)
    fresh = tree_map_only(torch.Tensor, lambda t: t.detach().clone(), state)  # DTensors stay DTensors
    try:
        with single_process_intended():
            dcp.load(fresh, storage_reader=SafeFileSystemReader(directory), planner=SafeLoadPlanner(), no_dist=not grouped())
    except CheckpointException as exc:  # a BaseException: turn it into the one error this load raises
        # failures: rank -> (exception, traceback summary)
        causes = "; ".join(f"rank {r}: {one_line(e[0] if isinstance(e, tuple) else e, with_type=True)}" for r, e in exc.failures.items())
        raise CheckpointError(f"{directory}: reading the shards failed ({causes or exc}); nothing was changed. Load an earlier checkpoint.") from None
    for i, model in enumerate(engine.models):
        set_model_state_dict(model, fresh[f"model.{i}"])
    notes = []
    for j, opt in enumerate(engine.optimizers):
        notes += lr_differs(j, opt, fresh[f"optim.{j}"])
        set_optimizer_state_dict(optimizer_owner(engine, opt), opt, fresh[f"optim.{j}"])
        guard_optimizer(opt)  # the saved groups' fused flags come from another machine or torch
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:  # one line per run, not per rank
        for note in notes:
            log.warning("%s", note)
