"""Train with ampkit under torchrun: DDP or FSDP2, any policy, a checkpoint every few steps, resume after a crash.

    torchrun --nproc-per-node 2 examples/train_distributed.py --strategy ddp --precision bf16-mixed
    torchrun --nproc-per-node 2 --max-restarts 3 examples/train_distributed.py --ckpt runs/last.pt --save-every 5

With ``--max-restarts``, torchrun restarts every rank when one dies; each starts again from the last checkpoint
(weights, optimizer, scheduler, loss scale, every rank's random stream), and the run ends exactly where an
uninterrupted one would. The data here is generated per (micro-batch, rank), so resuming needs no data-loader
state; with a real loader, save its position in ``extra`` as this script saves the micro-batch index.
Without torchrun (``python examples/train_distributed.py``) it runs as one process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

import torch
from torch import nn

import ampkit
from ampkit.distributed import init_distributed, shutdown
from ampkit.fileio import save_checkpoint

log = logging.getLogger("ampkit")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(nn.functional.gelu(self.fc(self.norm(x))))


def build_model(width: int = 64, depth: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, width), *[Block(width) for _ in range(depth)], nn.LayerNorm(width), nn.Linear(width, 4))


def micro_batch(index: int, rank: int, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of ``rank``: the same numbers however often the run is restarted."""
    g = torch.Generator().manual_seed(10_000 * index + rank)
    x = torch.randn(rows, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    return x.to(device), y.to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"))
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--rows", type=int, default=16, help="rows per micro-batch per rank")
    p.add_argument("--save-every", type=int, default=5, help="optimizer steps between checkpoints")
    p.add_argument("--ckpt", type=Path, help="checkpoint path (a directory under FSDP); resumed from when it exists")
    p.add_argument("--out", type=Path, help="write the final full parameters here (rank 0)")
    p.add_argument("--kill-at", type=int, help="testing: rank 1 kills itself after this micro-batch, on the first attempt only")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    env = init_distributed()
    model = build_model().to(env.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    engine = ampkit.Engine(args.precision, strategy=args.strategy, accumulate=args.accumulate, clip_grad_norm=1.0)
    model, optimizer = engine.setup(model, optimizer, schedulers=scheduler)
    torch.manual_seed(1234 + env.rank)  # each rank its own dropout stream

    start = 0
    if args.ckpt is not None and ampkit.checkpoint_exists(args.ckpt):  # also after a save killed mid-swap
        start = engine.load(args.ckpt)["micro"]
        log.info("resumed from %s at micro-batch %d (step %d)", args.ckpt, start, engine.steps)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for i in range(start, args.steps * args.accumulate):
        x, y = micro_batch(i, env.rank, args.rows, env.device)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if engine.step():
            if engine.steps % 5 == 0:
                log.info("step %d loss %.4f", engine.steps, loss.item())
            if args.ckpt is not None and engine.steps % args.save_every == 0:
                engine.save(args.ckpt, extra={"micro": i + 1})
        if args.kill_at is not None and i == args.kill_at and env.rank == 1 and first_attempt:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash: no cleanup, no goodbye to the other ranks

    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu() for n, p in engine.models[0].named_parameters()}
    if args.out is not None and env.is_main:
        save_checkpoint({"params": params, "steps": engine.steps, "skipped": engine.skipped_steps}, args.out)
    shutdown()


if __name__ == "__main__":
    main()
