"""Training across the ranks torchrun starts: process group, DDP / FSDP2 strategies, rank-0 logging, checkpoints.

    env = ampkit.distributed.init_distributed()                 # gloo on CPU, NCCL on GPU; world of 1 without torchrun
    engine = ampkit.Engine("bf16-mixed", accumulate=4, strategy="ddp")   # or "fsdp"
    model, optimizer = engine.setup(model.to(env.device), optimizer)
    ...                                                         # the single-device loop, unchanged
    engine.save("runs/last.pt")                                 # rank 0 writes (DDP); a sharded directory (FSDP)
    ampkit.distributed.shutdown()
"""

from ._agreement import agree_max, agree_min, any_rank, world_size
from ._environment import DistributedEnv, current_env, init_distributed, launched_by_torchrun, shutdown
from ._rank_logging import log_on_rank_zero, rank, rank_zero_only
from ._strategy import DDP, FSDP, Strategy, resolve_strategy

__all__ = [
    "agree_max",
    "agree_min",
    "any_rank",
    "world_size",
    "DistributedEnv",
    "current_env",
    "init_distributed",
    "launched_by_torchrun",
    "shutdown",
    "log_on_rank_zero",
    "rank",
    "rank_zero_only",
    "DDP",
    "FSDP",
    "Strategy",
    "resolve_strategy",
]
