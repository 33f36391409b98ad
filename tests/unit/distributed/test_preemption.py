"""Save on preemption across two gloo ranks, with a real SIGTERM that reaches rank 1 only: both ranks save the same
micro-batch and exit with the requeue code (none hangs waiting for the other), and the rerun ends bitwise equal to an
uninterrupted run.

The ranks are forked from the session's preloaded server (``tests/conftest.py``); each gets a fresh process group.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ampkit
from ampkit._compat import fsdp_problem
from ampkit.distributed import shutdown
from ampkit.fileio import load_checkpoint
from ampkit.training import REQUEUE_EXIT_CODE, Preempted

MICRO = 16
ACCUMULATE = 2
WORLD = 2
TIMEOUT_S = 60  # a run takes about a second: a rank waiting for one that left fails the test, not the suite


def _batch(i: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * i + rank)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _rank(rank: int, init: str, ckpt: str, out: str, strategy: str, signal_at: int | None) -> None:
    torch.set_num_threads(1)  # two ranks on two cores
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, 3))
    engine = ampkit.Engine("bf16-mixed", accumulate=ACCUMULATE, clip_grad_norm=1.0, strategy=strategy)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    torch.manual_seed(1 + rank)  # each rank its own dropout stream
    start = engine.load(ckpt)["micro"] if ampkit.checkpoint_exists(ckpt) else 0
    seen: list[int] = []
    counters = engine.step_state
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(counters.micro))  # the user's own
    try:
        with engine.save_on_preemption(ckpt, extra=lambda: {"micro": i + 1}):
            for i in range(start, MICRO):
                x, y = _batch(i, rank)
                with engine.autocast():
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                engine.backward(loss)
                if rank == 1 and i == signal_at:
                    os.kill(os.getpid(), signal.SIGTERM)  # only this rank gets it, in its micro-batch i
                engine.step()
    except Preempted:
        torch.save({"micro": engine.step_state.micro, "steps": engine.steps, "seen": seen}, f"{out}/rank{rank}.pt")
        raise
    params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in engine.models[0].parameters()]
    torch.save({"params": params, "start": start}, f"{out}/rank{rank}.pt")
    del model, engine
    shutdown()


def _run_ranks(tmp: Path, ckpt: Path, strategy: str, signal_at: int | None) -> tuple[list[int | None], list[dict[str, Any]]]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    ctx = multiprocessing.get_context("forkserver")
    ranks = [ctx.Process(target=_rank, args=(r, str(out / "init"), str(ckpt), str(out), strategy, signal_at)) for r in range(WORLD)]
    for p in ranks:
        p.start()
    deadline = time.monotonic() + TIMEOUT_S
    for p in ranks:
        p.join(max(0.0, deadline - time.monotonic()))
    codes = [p.exitcode for p in ranks]
    for p in ranks:
        if p.exitcode is None:
            p.kill()
    assert None not in codes, f"a rank hung (exit codes {codes})"
    return codes, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_a_signal_to_one_rank_saves_the_same_micro_batch_on_every_rank_and_resumes_bitwise(tmp_path: Path, strategy: str) -> None:
    if strategy == "fsdp" and fsdp_problem("cpu", WORLD) is not None:
        pytest.skip(str(fsdp_problem("cpu", WORLD)))
    ckpt = tmp_path / ("ck" if strategy == "fsdp" else "ck.pt")
    codes, straight = _run_ranks(tmp_path, tmp_path / "unused.pt", strategy, None)
    assert codes == [0, 0]

    signal_at = 6  # rank 1's micro-batch 6 of 16: the end of a window
    codes, stopped = _run_ranks(tmp_path, ckpt, strategy, signal_at)
    assert codes == [REQUEUE_EXIT_CODE] * WORLD
    assert stopped[0]["seen"] == [] and stopped[1]["seen"] == [signal_at]  # rank 1's own handler, chained
    assert stopped[0]["micro"] == stopped[1]["micro"] and stopped[0]["steps"] == stopped[1]["steps"]
    # The agreement is read one agreement after it starts: later than the micro-batch in flight at the signal.
    assert signal_at + 1 < stopped[0]["micro"]
    if strategy == "ddp":
        assert load_checkpoint(ckpt)["extra"]["micro"] == stopped[0]["micro"]

    codes, resumed = _run_ranks(tmp_path, ckpt, strategy, None)
    assert codes == [0, 0] and resumed[0]["start"] == stopped[0]["micro"]
    for rank in range(WORLD):
        for a, b in zip(resumed[rank]["params"], straight[rank]["params"]):
            assert torch.equal(a, b)
