"""Checkpoints of a run spread over ranks: one file written by rank 0 (DDP), a sharded directory (FSDP).

* **DDP** (and any replicated run): every rank holds the same model and optimizer, so rank 0 writes the usual
  single file (atomically, as :func:`ampkit.fileio.save_checkpoint` does). What differs per rank travels with
  it: each rank's RNG state (dropout masks differ per rank) and, inside an accumulation window, each rank's
  local gradients. The file loads on any number of ranks, or in a single process.
* **FSDP**: each rank writes its shards with ``torch.distributed.checkpoint`` (DCP) into a temporary directory,
  rank 0 adds ``ampkit.pt`` (engine state, schedulers, every rank's RNG, ``extra``) and swaps the directory into
  place (:mod:`ampkit.checkpoint._sharded_dir`): ``path`` is the previous checkpoint or the new one, and a
  save killed between the swap's two renames is found again by the next load. DCP reshards on load: a
  directory written by 8 ranks resumes on 4, on DDP, or in a single process.

Loading validates on every rank first and agrees: if the file is bad on any rank, every rank raises and no
rank changes anything. A sharded directory is checked before anything is read: its metadata (unpickled through
an exact allow-list, :mod:`ampkit.checkpoint._safe_dcp`) must list this model's and optimizer's entries with
their shapes, and every shard file must be there and long enough. The shards are then read into fresh tensors
and copied into the model only once all of them loaded. A run resumed on the same number of ranks is
bitwise equal to an uninterrupted one; on another number the random streams cannot be mapped and start from
where each rank stands (a warning says so), and a checkpoint taken inside an accumulation window is refused.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from .._errors import CheckpointError, one_line
from ..distributed._strategy import FSDP
from ..fileio._checkpoint_files import capture_rng_state, load_checkpoint, save_checkpoint
from ..fileio._checksums import file_crc32
from ..fileio._disk import full_disk_message, storage_bytes
from ..fileio._temporaries import writer_token
from ._checks import check_training_payload
from ._dcp_state import grouped, sharded_state, single_process_intended
from ._payload import Undo, apply_payload, pending_grads, training_payload
from ._sharded_dir import ENGINE_FILE, find_checkpoint, is_complete, remove_leftovers, swap_into_place

if TYPE_CHECKING:
    from ..training._engine_protocol import EngineLike

__all__ = ["save_distributed", "load_distributed", "ENGINE_FILE"]

log = logging.getLogger("ampkit")


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if grouped() else (0, 1)


def _raise_if_any(error: str | None, what: str) -> None:
    """Every rank raises when any rank failed, so no rank goes on alone (or waits forever in a collective)."""
    errors: list[str | None] = [error]
    if grouped():
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        # Every failed rank's own reason (one rank's disk may be full and another's not), rank 0's message included.
        where = "; ".join(f"rank {r}: {e}" for r, e in failed) if len(errors) > 1 else failed[0][1]
        raise CheckpointError(f"{what} failed on {where}")


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank gets the same answer)."""
    flags: list[bool] = [flag]
    if grouped():
        flags = [False] * dist.get_world_size()
        dist.all_gather_object(flags, flag)
    return any(flags)


def _write_failure(exc: BaseException, rank: int, directory: Path, state: dict[str, Any]) -> str | None:
    """This rank's part of a failed DCP save, naming a full disk; None where only other ranks failed."""
    from torch.distributed.checkpoint.api import CheckpointException

    cause: BaseException | None = exc
    if isinstance(exc, CheckpointException):  # DCP hands every rank every rank's failure: rank -> (exception, traceback)
        own = exc.failures.get(rank)
        if own is None:
            return None if exc.failures else one_line(exc, with_type=True)
        cause = own[0] if isinstance(own, tuple) else own
    assert cause is not None
    full = full_disk_message(cause, directory.parent, storage_bytes(state), "this rank's shards need")
    if full is not None:
        return f"{full}. Free space there or save elsewhere; the previous checkpoint is untouched"
    return one_line(cause, with_type=True)


def _gather_to_rank0(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order on rank 0; an empty list on the other ranks."""
    rank, world = _rank_world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(obj, out if rank == 0 else None, dst=0)
    return out


def _broadcast_from_rank0(obj: Any) -> Any:
    box = [obj]
    if grouped():
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _remove_leftovers(target: Path) -> None:
    """What killed saves to ``target`` left, removed on rank 0 before the others hear the token: never an error."""
    try:
        remove_leftovers(target)
    except Exception as exc:  # noqa: BLE001 - the other ranks wait in the broadcast: raising here would hang them
        log.warning("could not remove what killed saves to %s left: %s", target, one_line(exc, with_type=True))


def save_distributed(engine: EngineLike, path: str | os.PathLike[str], extra: dict[str, Any] | None = None) -> None:
    """Every rank calls it: rank 0 writes a file (DDP), or all ranks write a sharded directory (FSDP)."""
    rank, world = _rank_world()
    sharded = isinstance(engine.strategy, FSDP)
    if sharded and engine.micro_batches_pending:
        raise CheckpointError(
            "under FSDP, save at an accumulation boundary (when engine.step() returned True): the pending "
            "gradients are unsharded per rank and are not part of a sharded checkpoint."
        )
    pending = None if sharded else pending_grads(engine)
    if pending is not None:
        # On the host before gathering: a rank's CUDA tensors would unpickle on rank 0 onto that rank's GPU
        # (another CUDA context there, or a missing device on another node).
        pending = {name: grad.cpu() for name, grad in pending.items()}
    mine = {"rng": capture_rng_state(), "pending_grads": pending}
    gathered = _gather_to_rank0(mine)
    target = Path(os.fspath(path))
    token = None
    if rank == 0:
        token = writer_token()  # rank 0's identity names the directory every rank writes into
        if sharded:
            _remove_leftovers(target)
    # The other ranks wait here: none writes into the folder before the leftovers are gone and the space is free.
    token = _broadcast_from_rank0(token)
    tmp = target.with_name(f"{target.name}.{token}.tmp")
    error = None
    if sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        state = sharded_state(engine)
        failure: BaseException | None = None
        try:
            with single_process_intended():
                dcp.save(state, checkpoint_id=tmp, no_dist=not grouped())
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP's is a BaseException; reported on every rank
            failure = exc
        if _any_rank(failure is not None):
            # The partial directory goes first, so the free space each rank then names is what the next try has.
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            if grouped():
                dist.barrier()
            error = None if failure is None else _write_failure(failure, rank, tmp, state)
            _raise_if_any(error or None, f"saving {target}")
            _raise_if_any("a rank failed without a reason", f"saving {target}")  # pragma: no cover - DCP names one
        # Each rank's checksums of the files it wrote (read back once, from the page cache), kept in ampkit.pt.
        written = [tmp / ".metadata"] if rank == 0 else []
        written += sorted(tmp.glob(f"__{rank}_*.distcp"))
        shard_sums = _gather_to_rank0({f.name: file_crc32(f) for f in written})
    if rank == 0:
        try:
            payload = training_payload(engine, extra, tensors=not sharded)
            payload["ranks"] = {
                "strategy": engine.strategy.name if engine.strategy is not None else None,
                "world_size": world,
                "rng": [g["rng"] for g in gathered],
                "pending_grads": [g["pending_grads"] for g in gathered],
            }
            if sharded:
                payload["shards"] = {name: crc for sums in shard_sums for name, crc in sums.items()}
                save_checkpoint(payload, tmp / ENGINE_FILE)
                swap_into_place(tmp, target, token)
            else:
                save_checkpoint(payload, target)
        except Exception as exc:  # noqa: BLE001 - reported on every rank below
            error = one_line(exc, with_type=True)
            shutil.rmtree(tmp, ignore_errors=True)
    _raise_if_any(error, f"saving {target}")


def _read(engine: EngineLike, target: Path) -> tuple[Path, dict[str, Any], Any]:
    """The checkpoint's location, its payload and (for a sharded directory) its checked DCP metadata."""
    found = find_checkpoint(target)
    if found is None:
        raise CheckpointError(f"no checkpoint at {target}; check the path (and the working directory).")
    metadata = None
    if found.is_dir():
        if not is_complete(found):
            raise CheckpointError(f"{found} is a directory but not a complete sharded checkpoint (needs .metadata and {ENGINE_FILE}).")
        payload = load_checkpoint(found / ENGINE_FILE, map_location="cpu")
        from ._sharded_load import read_metadata, verify_shards

        verify_shards(found, payload.get("shards"), *_rank_world())

        metadata = read_metadata(found)
    else:
        payload = load_checkpoint(found, map_location="cpu")
        if isinstance(engine.strategy, FSDP):
            raise CheckpointError(
                f"{found} is a single-file checkpoint; an FSDP run loads the sharded directories engine.save() writes under "
                "FSDP. Resume this file with strategy='ddp' (or in one process)."
            )
    check_training_payload(engine, payload, found)
    return found, payload, metadata


def load_distributed(engine: EngineLike, path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Every rank calls it; validates on every rank, then restores (all or nothing). Returns the checkpoint's ``extra``."""
    rank, world = _rank_world()
    target = Path(os.fspath(path))
    found, payload, metadata, error = target, None, None, None
    try:
        found, payload, metadata = _read(engine, target)
        ranks = payload.get("ranks") or {"world_size": 1, "rng": [payload["rng"]], "pending_grads": [payload["engine"]["pending_grads"]]}
        if ranks["world_size"] != world and any(g is not None for g in ranks["pending_grads"]):
            raise CheckpointError(
                f"{found} was saved by {ranks['world_size']} rank(s) inside an accumulation window; resume it on "
                f"{ranks['world_size']} rank(s), or save at an accumulation boundary to change the world size."
            )
    except CheckpointError as exc:
        error = str(exc)
    _raise_if_any(error, f"loading {target}")
    assert payload is not None
    if ranks["world_size"] == world:
        payload["rng"] = ranks["rng"][rank]
        payload["engine"]["pending_grads"] = ranks["pending_grads"][rank]
    else:
        payload["rng"] = None
    undo = Undo(engine)  # before the shards are read: reading initialises an empty optimizer's state in place
    try:
        with undo:
            if metadata is not None:
                from ._sharded_load import load_shards

                load_shards(engine, found, metadata)
            apply_payload(engine, payload)
    except CheckpointError as exc:
        error = str(exc)
    try:
        _raise_if_any(error, f"loading {found}")
    except CheckpointError:
        if error is None:
            undo.restore()  # another rank failed: no rank keeps the new state
        raise
    if ranks["world_size"] != world:
        log.warning(
            "%s was saved by %d rank(s) and resumes on %d: weights, optimizer and scaler are restored, the random "
            "streams are not (they cannot be mapped between world sizes).", found, ranks["world_size"], world,
        )
    if grouped():
        dist.barrier()  # no rank trains on before every rank has its state
    extra: dict[str, Any] | None = payload["extra"]  # as save() was given it
    return extra
