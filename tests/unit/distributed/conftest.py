"""Running a test body on spawned ranks, with results passed back through files.

The ranks follow the device of the pass (``pytest --device``): on the CPU, two gloo ranks; on CUDA, one NCCL
rank on the pass's GPU (world size 1: the GPU machines have one GPU, and NCCL refuses two ranks on one device).
A body is ``fn(rank, device, *args)``: it builds its model and data on ``device``, and reads the world size
from ``torch.distributed.get_world_size()`` (tests size their batches by the ``world`` fixture).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ampkit._compat import fsdp_problem
from ampkit.distributed import shutdown

TIMEOUT_S = 120


def _entry(rank: int, fn: Callable[..., Any], world: int, device: str, init_file: str, out_dir: str, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)  # two ranks on two cores
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # .cuda(), NCCL's object collectives and torch.cuda.current_device() land here
        # device_id binds the group to the GPU: barrier() then needs no guess (and gives no warning about one).
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=dev)
    else:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = fn(rank, dev, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:
        dist.destroy_process_group()  # no barrier: the other rank may never reach it
        raise
    # A barrier (neither rank tears gloo down while the other still talks to it), then the group ends and DTensor's
    # caches let go of it, so gloo's threads are joined before the interpreter finalizes: with a bare
    # destroy_process_group an FSDP body left them running, and a rank could abort at exit ("terminate called
    # without an active exception", SIGABRT).
    shutdown()


@pytest.fixture
def fsdp_trains_correctly(device: torch.device, world: int) -> None:
    """Skip a test that compares FSDP's training with DDP's where this torch's FSDP computes wrong gradients."""
    problem = fsdp_problem(device.type, world)
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def world(device: torch.device) -> int:
    """Ranks a distributed test runs on: 2 gloo ranks on the CPU, 1 NCCL rank on CUDA."""
    return 1 if device.type == "cuda" else 2


@pytest.fixture
def run_ranks(tmp_path: Path, device: torch.device, world: int) -> Callable[..., list[Any]]:
    """``run_ranks(fn, *args)``: ``fn(rank, device, *args)`` on each of ``world`` ranks; returns what each returned
    (tensors, dicts), loaded onto the device they were saved from."""

    def run(fn: Callable[..., Any], *args: Any) -> list[Any]:
        out = Path(tempfile.mkdtemp(prefix=f"{fn.__name__}-", dir=tmp_path))  # a fresh rendezvous file per run
        entry_args = (fn, world, str(device), str(out / "init"), str(out), args)
        # A fork of the session's preloaded server (tests/conftest.py), not a spawn: fresh ranks in well under a second.
        context = mp.start_processes(_entry, args=entry_args, nprocs=world, join=False, start_method="forkserver")
        deadline = time.monotonic() + TIMEOUT_S
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:  # a hung collective must fail the test, not stall the suite
                for p in context.processes:
                    p.kill()
                pytest.fail(f"{fn.__name__} did not finish on {world} ranks within {TIMEOUT_S} s")
        return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]

    return run
