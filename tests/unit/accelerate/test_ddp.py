"""``AmpkitAccelerator`` under Accelerate's DDP (MULTI_CPU, two gloo ranks): an overflow in one rank's gradients, after
DDP's all-reduce, so that only that rank sees it, makes every rank skip the same step, and the ranks' weights stay
equal bit for bit. The ranks are forked from the session's preloaded server (``tests/conftest.py``), as the
distributed tests' ranks are."""

from __future__ import annotations

import gc
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
STEPS = 5
POISONED_STEP = 2
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, policy: str, init_file: str, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    # What `accelerate launch` / torchrun sets: Accelerate reads the world from these (MULTI_CPU on gloo).
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        _train(rank, policy, out_dir)
        # The DDP model is gone (with _train's frame) while the group is still registered: had its reducer dropped
        # the group's last reference after destroy_process_group, gloo's destructor would run holding the GIL, which
        # a gloo worker still freeing the last all-reduce's tensors waits for (a hang seen under load, 1 run in ~10).
        gc.collect()
    finally:
        dist.destroy_process_group()


def _train(rank: int, policy: str, out_dir: str) -> None:
    import ampkit
    from ampkit.accelerate import AmpkitAccelerator

    accelerator = AmpkitAccelerator(policy, scaler=ampkit.ScalerConfig(init_scale=2.0**8), cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(model, opt)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    skipped = []
    for step in range(STEPS):
        x, y = torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        accelerator.backward(loss)
        if step == POISONED_STEP and rank == 0:
            model.module[0].weight.grad.view(-1)[0] = float("inf")  # after the all-reduce: rank 0's alone
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        skipped.append(accelerator.optimizer_step_was_skipped)
    result = {"skipped": skipped, "scale": accelerator.engine.scale, "wrapped": type(model).__name__,
              "dtype": str(model.module[0].weight.dtype), "params": [p.detach().clone() for p in model.module.parameters()],
              "distributed": accelerator.distributed_type.value}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def _run_ranks(policy: str, tmp_path: Path) -> list[dict[str, Any]]:
    out = Path(tempfile.mkdtemp(dir=tmp_path))
    context = mp.start_processes(_rank, args=(policy, str(out / "init"), _free_port(), str(out)), nprocs=WORLD, join=False,
                                 start_method="forkserver")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the ranks did not finish within {TIMEOUT_S} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.parametrize("policy", ["16-mixed", "16-true-masters"])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(policy: str, tmp_path: Path) -> None:
    ranks = _run_ranks(policy, tmp_path)
    want = [step == POISONED_STEP for step in range(STEPS)]
    for r in ranks:
        assert r["distributed"] == "MULTI_CPU" and r["wrapped"] == "DistributedDataParallel"
        assert r["dtype"] == ("torch.float16" if policy == "16-true-masters" else "torch.float32")  # DDP wraps the cast model
        assert r["skipped"] == want
        assert r["scale"] == 2.0**8 * 0.5
    for p, q in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(p, q)
