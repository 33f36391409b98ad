"""Running a test body on two gloo ranks (CPU), each a spawned process, with results passed back through files."""

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

from ampkit.distributed import shutdown

TIMEOUT_S = 120


def _entry(rank: int, fn: Callable[..., Any], world: int, init_file: str, out_dir: str, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = fn(rank, *args)
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
def run_ranks(tmp_path: Path) -> Callable[..., list[Any]]:
    """``run_ranks(fn, *args, world=2)``: ``fn(rank, *args)`` on each rank; returns what each returned (tensors, dicts)."""

    def run(fn: Callable[..., Any], *args: Any, world: int = 2) -> list[Any]:
        out = Path(tempfile.mkdtemp(prefix=f"{fn.__name__}-", dir=tmp_path))  # a fresh rendezvous file per run
        context = mp.spawn(_entry, args=(fn, world, str(out / "init"), str(out), args), nprocs=world, join=False)
        deadline = time.monotonic() + TIMEOUT_S
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:  # a hung collective must fail the test, not stall the suite
                for p in context.processes:
                    p.kill()
                pytest.fail(f"{fn.__name__} did not finish on {world} ranks within {TIMEOUT_S} s")
        return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]

    return run
