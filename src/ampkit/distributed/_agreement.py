"""Decisions every rank must take together, such as a batch size or a micro-batch split after an OOM.

A rank that decides alone desynchronises the collectives of the others (one rank running two backward passes
where the others run one hangs DDP). Each helper here is one all-reduce of a single integer when a process
group of more than one rank is initialised, and returns its argument unchanged otherwise (no sync then).

    >>> agree_min(64), agree_max(2), from_rank0(7), world_size()   # no process group: nothing to agree with
    (64, 2, 7, 1)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["agree_max", "agree_min", "any_rank", "from_rank0", "world_size"]


def world_size() -> int:
    """Ranks in the default process group; 1 when none is initialised."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _int_tensor(value: int) -> torch.Tensor:
    # NCCL reduces only CUDA tensors; gloo reduces CPU ones. One int either way: the answer is read on the host.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return torch.tensor([value], dtype=torch.int64, device=device)


def _agree(value: int, op: dist.ReduceOp.RedOpType) -> int:
    if world_size() == 1:
        return value
    t = _int_tensor(value)
    dist.all_reduce(t, op=op)
    return int(t.item())


def agree_min(value: int) -> int:
    """The smallest ``value`` over all ranks (every rank must call it). One all-reduce; syncs."""
    return _agree(value, dist.ReduceOp.MIN)


def agree_max(value: int) -> int:
    """The largest ``value`` over all ranks (every rank must call it). One all-reduce; syncs."""
    return _agree(value, dist.ReduceOp.MAX)


def from_rank0(value: int) -> int:
    """Rank 0's ``value`` (an int64) on every rank, such as a seed the ranks must share (every rank must call it).
    One broadcast; syncs."""
    if world_size() == 1:
        return value
    t = _int_tensor(value)
    dist.broadcast(t, src=0)
    return int(t.item())


def any_rank(flags: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flags`` (0-dim found-inf tensors, one per optimizer) set wherever any rank has them set.

    One all-reduce (MAX) of the stacked flags, on their device, without a host sync; ``flags`` unchanged in a
    world of one. Every rank must call it.

    >>> any_rank([torch.tensor(0.0), torch.tensor(1.0)])
    [tensor(0.), tensor(1.)]
    """
    if world_size() == 1 or not flags:
        return flags
    stacked = torch.stack(flags)
    dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
    return list(stacked.unbind())
