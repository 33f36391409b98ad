"""Apex's ``SyncBatchNorm`` and ``convert_syncbn_model`` on ``torch.nn.SyncBatchNorm``.

torch's SyncBatchNorm computes batch statistics across the process group with its own CUDA kernels; outside
a process group it is a plain BatchNorm. Two differences are smoothed over here. A one-process group has
nothing to synchronise, so this class runs plain batch norm there, on any device (torch refuses CPU input as
soon as a group exists). With several CPU processes torch's refusal stands, since it has no CPU kernel for
the cross-process statistics; torch's DistributedDataParallel also refuses SyncBatchNorm in CPU modules
(ampkit.apex's DistributedDataParallel says so and names the fix). And :func:`convert_syncbn_model` returns
modules of *this* class, as Apex did, so ``isinstance(m, apex.parallel.SyncBatchNorm)`` keeps working.
Apex's NHWC (``channel_last``) and fused-ReLU kernels have no torch counterpart and raise.
:func:`create_syncbn_process_group` splits the world into the groups that synchronise together.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["SyncBatchNorm", "convert_syncbn_model", "create_syncbn_process_group"]

_CHANNEL_LAST = (
    "channel_last=True (NHWC input, channels in the last dimension) has no torch SyncBatchNorm equivalent: torch's "
    "takes (N, C, ...) input. Drop channel_last and permute the input to (N, C, H, W); a tensor in "
    "torch.channels_last memory format is already (N, C, H, W) logically and works as it is."
)


class SyncBatchNorm(nn.SyncBatchNorm):
    """Apex's ``apex.parallel.SyncBatchNorm`` signature on ``torch.nn.SyncBatchNorm``.

    ``channel_last=True``, ``fuse_relu=True`` and the residual ``z`` of Apex's fused kernel raise, naming the
    torch spelling. Outside a process group, or in a group of one, it is plain batch norm.

    >>> bn = SyncBatchNorm(3)
    >>> bn(torch.randn(4, 3)).shape, isinstance(bn, nn.SyncBatchNorm)
    (torch.Size([4, 3]), True)
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        channel_last: bool = False,
        fuse_relu: bool = False,
    ) -> None:
        if channel_last:
            raise NotImplementedError(_CHANNEL_LAST)
        if fuse_relu:
            raise NotImplementedError(
                "fuse_relu=True has no torch SyncBatchNorm equivalent. Drop it and apply torch.relu (or nn.ReLU) to the "
                "output; torch.compile fuses the two."
            )
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group)
        self.channel_last = False
        self.fuse_relu = False

    def _alone(self) -> bool:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return False  # torch's own forward already runs plain batch norm here
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return dist.get_world_size(group) == 1

    def forward(self, input: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise ``input`` (N, C, ...); ``z`` (Apex's fused residual) must be None."""
        if z is not None:
            raise NotImplementedError("SyncBatchNorm's z (Apex's fused residual add) has no torch equivalent: compute bn(x) + z instead.")
        if self.training and self._alone():
            # Nothing to synchronise with; torch's forward would reject CPU input before noticing.
            return nn.modules.batchnorm._BatchNorm.forward(self, input)
        return super().forward(input)


def convert_syncbn_model(module: nn.Module, process_group: Any = None, channel_last: bool = False) -> nn.Module:
    """Replace every BatchNorm in ``module`` with :class:`SyncBatchNorm` (torch's conversion, Apex's class).

    Parameters and buffers are the same objects afterwards, so an optimizer built earlier stays valid.

    >>> net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    >>> type(convert_syncbn_model(net)[1]).__name__
    'SyncBatchNorm'
    """
    if channel_last:
        raise NotImplementedError(_CHANNEL_LAST)
    # Holding the old modules keeps their ids from being reused by the new ones while we compare.
    originals = list(module.modules())
    before = {id(m) for m in originals}
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
    for m in converted.modules():
        if type(m) is nn.SyncBatchNorm and id(m) not in before:
            # Same layout, added methods only: the swap keeps every parameter, buffer and hook as torch set them.
            m.__class__ = SyncBatchNorm
            m.channel_last = False
            m.fuse_relu = False
    return converted


def create_syncbn_process_group(group_size: int) -> Any:
    """Split the world into consecutive groups of ``group_size`` ranks; return the group this rank is in.

    As Apex: ``group_size=0`` means one group of every rank and returns None (the default group); every rank
    creates every group, in the same order, because ``torch.distributed.new_group`` is collective. Pass the
    result as ``process_group=`` to :func:`convert_syncbn_model`. Needs an initialized process group.

    >>> create_syncbn_process_group(0) is None
    True
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0:
        raise ValueError(f"group_size must be an int >= 0 (0: the whole world), got {group_size!r}.")
    if group_size == 0:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"create_syncbn_process_group({group_size}) splits an existing process group: call "
            "torch.distributed.init_process_group(...) first (torchrun sets up its environment)."
        )
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % group_size:
        divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        raise ValueError(f"group_size={group_size} does not divide the world size {world}: pass a divisor of it ({divisors}) or 0 for the whole world.")
    mine = None
    for start in range(0, world, group_size):
        group = dist.new_group(ranks=list(range(start, start + group_size)))
        if start <= rank < start + group_size:
            mine = group  # keep going: the other ranks' groups must be created here too
    return mine
