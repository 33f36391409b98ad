"""The process group of a run launched by ``torchrun``: initialise it from torchrun's environment, read it, end it.

torchrun starts one process per device and tells each who it is through environment variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). :func:`init_distributed` turns them into a
process group with the backend the device needs (NCCL for CUDA, gloo for CPU) and pins each process to its own
GPU, so a script runs unchanged from ``python train.py`` to ``torchrun --nproc-per-node 8 train.py``:

    env = ampkit.distributed.init_distributed()      # world of 1 without torchrun
    engine = ampkit.Engine("bf16-mixed", strategy="ddp")
    ...
    ampkit.distributed.shutdown()

Without torchrun (and no ``RANK`` in the environment) nothing is initialised and the answer is a world of one:

    >>> env = current_env()
    >>> (env.rank, env.world_size, env.is_main)
    (0, 1, True)
"""

from __future__ import annotations

import atexit
import datetime
import gc
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .._compat import clear_dtensor_caches, clear_mesh_process_groups
from ._rank_logging import log_on_rank_zero

__all__ = ["DistributedEnv", "init_distributed", "current_env", "launched_by_torchrun", "shutdown", "TORCHRUN_VARIABLES"]

log = logging.getLogger("ampkit")

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for every worker; all of them are needed to join a process group."""


@dataclass(frozen=True)
class DistributedEnv:
    """Who this process is in the run: its rank, its rank on this machine, the world size, backend and device."""

    rank: int
    local_rank: int
    world_size: int
    backend: str | None
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that logs, writes files and prints tables."""
        return self.rank == 0

    @property
    def initialized(self) -> bool:
        """True when a process group exists (even one of a single rank)."""
        return self.backend is not None


def launched_by_torchrun() -> bool:
    """True when this process runs under torchrun (every variable a worker needs is set).

    >>> launched_by_torchrun() == all(v in os.environ for v in TORCHRUN_VARIABLES)
    True
    """
    return all(v in os.environ for v in TORCHRUN_VARIABLES)


def _int_env(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} in the environment is not an integer; launch with torchrun, which sets it.") from None


def _default_device(local_rank: int, device: str | torch.device | None) -> torch.device:
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
        return dev
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} but only {count} GPU(s) are visible; launch at most {count} processes per node "
                "(torchrun --nproc-per-node), or pass device='cpu' to train on the CPU with gloo."
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(
    backend: str | None = None,
    device: str | torch.device | None = None,
    timeout: datetime.timedelta | None = None,
    rank_zero_logging: bool = True,
) -> DistributedEnv:
    """Join the process group torchrun describes; a world of one (no group) when not launched by torchrun.

    Args:
        backend: ``"nccl"``, ``"gloo"``; default: NCCL on a GPU, gloo on the CPU.
        device: this process's device; default: ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU.
        timeout: how long a collective may wait for the other ranks before failing (torch's default: 10 min).
        rank_zero_logging: let only rank 0 log ampkit's info and warnings (errors log on every rank).

    Calling it again returns the same answer. The CUDA device is made current, so ``.cuda()`` lands on it.

    >>> init_distributed().world_size if not launched_by_torchrun() else 1
    1
    """
    if dist.is_available() and dist.is_initialized():
        return current_env()
    if not launched_by_torchrun():
        if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
            missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
            raise RuntimeError(
                f"RANK/WORLD_SIZE are set but {', '.join(missing)} are not: launch with torchrun "
                "(torchrun --nproc-per-node N script.py), which sets all of them."
            )
        return current_env(device)
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; install a build with distributed support to use torchrun.")
    rank, local_rank, world = _int_env("RANK"), _int_env("LOCAL_RANK"), _int_env("WORLD_SIZE")
    dev = _default_device(local_rank, device)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise RuntimeError("backend='nccl' needs CUDA devices; use backend='gloo' (or leave it out) to train on the CPU.")
    # Only what differs from torch's defaults is passed (Any: each key has its own type in init_process_group).
    kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        # Bound to its GPU, an NCCL group knows where a barrier's tensor lives (unbound, shutdown()'s barrier
        # guesses the current device and warns about it) and connects at once rather than on first use.
        kwargs["device_id"] = dev
    dist.init_process_group(backend, store=_attempt_store(rank, world, timeout), rank=rank, world_size=world, **kwargs)
    _end_at_exit()
    if rank_zero_logging:
        log_on_rank_zero()
    log.info("process group: %d rank(s), backend %s, rank 0 on %s", world, backend, dev)
    return current_env(dev)


def _attempt_store(rank: int, world: int, timeout: datetime.timedelta | None) -> dist.Store:
    """torchrun's store, with keys private to this restart attempt.

    After ``torchrun --max-restarts`` restarts the workers, the store still holds the previous attempt's keys,
    among them each rank's gloo address: a new rank that reads the dead one's address before it is overwritten
    fails with "connectFullMesh failed ... Connection refused" (seen with torch 2.13). A prefix per attempt
    makes every attempt wait for its own addresses.
    """
    kwargs = {"timeout": timeout} if timeout is not None else {}
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world, **kwargs))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ampkit/attempt-{attempt}/", store)


def current_env(device: str | torch.device | None = None) -> DistributedEnv:
    """The run as it stands: the process group's rank and size, or rank 0 of 1 when there is none."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if launched_by_torchrun() else 0
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        dev = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        return DistributedEnv(dist.get_rank(), local_rank, dist.get_world_size(), backend, dev)
    return DistributedEnv(0, 0, 1, None, _default_device(0, device))


def shutdown() -> None:
    """Wait for every rank, end the process group, and let go of torch's cached references to it (a no-op without one).

    The barrier matters: a rank that tears gloo down while another still sends to it makes that one abort.

    Letting go matters too. ``destroy_process_group`` only unregisters a group; its gloo worker threads stop when
    the last reference goes, and DTensor's sharding caches (filled by every FSDP2 step) keep one for the rest of
    the process. Those threads would then still be alive while the interpreter finalizes, and a worker that frees
    a finished collective's tensors at that moment needs the GIL, which a finalizing interpreter refuses by ending
    the thread: "terminate called without an active exception", a rank killed by SIGABRT after the job finished,
    and torchrun restarting it. So the caches are cleared here and the threads are joined as soon as the model
    (which holds the group too) is gone: here, if it already is, else when the training function returns (a hook
    run at exit, before finalization, collects it). A model kept in a module-level variable lives until
    finalization: ``del`` it before ``shutdown()``.

    And the order matters: garbage is collected *before* the group ends. A DDP model's reducer holds the group from
    C++; if it drops the group's last reference, gloo's destructor runs holding the GIL and waits for its workers,
    while a worker still freeing a finished all-reduce's tensors waits for the GIL: a hang. Freed while the group is
    still registered, the reducer's reference is never the last, and the group's own destructor lets the GIL go.

    >>> shutdown()  # nothing to end in a single process
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        gc.collect()  # a DDP model that is garbage lets go of the group while the group is still registered
        dist.destroy_process_group()
    _release_destroyed_groups()


def _unlink_surviving_meshes() -> None:
    # torch 2.11's C++ DTensor fast path keeps references to the specs it cached that clearing its cache does not
    # drop, so there a DeviceMesh outlives the caches, holding its (destroyed) groups in _pg_registry. The registry
    # only serves torch.compile tracing; emptying it lets the groups, and their gloo threads, go.
    if "torch.distributed.tensor" not in sys.modules:
        return  # DTensor never ran: nothing of it holds a mesh
    from torch.distributed.device_mesh import DeviceMesh

    # type(), not isinstance(): an isinstance check on every live object reaches objects whose __class__ warns.
    meshes = [o for o in gc.get_objects() if issubclass(type(o), DeviceMesh) and clear_mesh_process_groups(o)]
    if meshes:
        log.debug("dropped the process groups of %d DeviceMesh(es) that outlived shutdown", len(meshes))
        gc.collect()


def _release_destroyed_groups() -> None:
    clear_dtensor_caches()
    gc.collect()  # FSDP modules are reference cycles: a group they hold goes only when a collection runs
    _unlink_surviving_meshes()


_hooked = False


def _end_at_exit() -> None:
    """At exit, end a group ampkit started that is still there, and join its threads while the interpreter is whole.

    atexit runs before finalization begins; the training function has returned by then, so its model is garbage.
    No barrier: a run that exits on an exception must not wait for ranks that may never come.
    """
    global _hooked
    if not _hooked:
        atexit.register(_at_exit)
        _hooked = True


def _at_exit() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _release_destroyed_groups()
