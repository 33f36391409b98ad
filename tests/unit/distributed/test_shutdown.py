"""shutdown() leaves no gloo thread behind once the model is gone, so none is alive when the interpreter finalizes.

A gloo worker still alive at finalization that frees a finished collective's tensors needs the GIL; the finalizing
interpreter ends the thread inside a noexcept destructor and the rank dies with "terminate called without an active
exception" (SIGABRT) after the job finished. The group's destructor joins its threads, but only once nothing holds
the group: DTensor's caches, filled by every FSDP2 step, held it for the rest of the process.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from ampkit._compat import fsdp_problem

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
# FSDP on two gloo ranks: where this torch's FSDP trains wrongly on the CPU, ampkit refuses it.
pytestmark = pytest.mark.skipif(fsdp_problem("cpu", 2) is not None, reason=str(fsdp_problem("cpu", 2)))


def _gloo_threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return [n for n in names if n in GLOO_THREADS]


def _train_then_shutdown(out: str) -> None:
    import ampkit
    from ampkit.distributed import init_distributed, shutdown

    env = init_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    engine = ampkit.Engine("bf16-mixed", strategy="fsdp")
    model, optimizer = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        with engine.autocast():
            loss = model(torch.randn(4, 8)).float().square().mean()
        engine.backward(loss)
        engine.step()
    during = _gloo_threads()
    del model, optimizer, engine, loss  # what returning from the training function does
    shutdown()
    Path(out, f"rank{env.rank}.txt").write_text(f"{len(during)} {len(_gloo_threads())}")


def _entry(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _train_then_shutdown(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Requires: Linux /proc to list threads")
def test_shutdown_joins_the_gloo_threads_after_fsdp_steps(tmp_path: Path) -> None:
    mp.spawn(_entry, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        during, after = map(int, (tmp_path / f"rank{rank}.txt").read_text().split())
        assert during > 0, "the check must see gloo's threads while the group is in use"
        assert after == 0, f"rank {rank}: {after} gloo thread(s) still alive after shutdown()"


# The symptom itself: before the fix about 1 in 20 of these jobs ended with a rank killed by SIGABRT at exit. Each job
# is two rank processes started as torchrun starts them (its variables, its store at MASTER_ADDR:MASTER_PORT) but
# without torchrun's agent, whose own start was a quarter of each job's time and plays no part at a rank's exit:
# about 6 s in CI on 2 cores, so CI runs 10: a 1-in-20 failure shows with probability 1 - 0.95^10 = 40% per CI run,
# 87% over four; the cause, gloo's threads still alive after shutdown(), is checked on every run by the test above.
# Before changing the shutdown path, run AMPKIT_SHUTDOWN_RUNS=60 (95%).
SHUTDOWN_RUNS = int(os.environ.get("AMPKIT_SHUTDOWN_RUNS", "10"))


@pytest.mark.slow
def test_fsdp_jobs_exit_cleanly_run_after_run(tmp_path: Path) -> None:
    """Two-rank jobs of FSDP steps, one after another: every rank exits 0 without ``terminate called``."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    failures = []
    for i in range(SHUTDOWN_RUNS):
        port = _free_port()
        args = [sys.executable, str(root / "examples" / "train_distributed.py"), "--strategy", "fsdp", "--steps", "4",
                "--save-every", "2", "--ckpt", str(tmp_path / f"ck{i}")]
        ranks = [
            subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={
                **os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src"), "RANK": str(rank), "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            for rank in range(2)
        ]
        for rank, process in enumerate(ranks):
            try:
                _, stderr = process.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for p in ranks:
                    p.kill()
                raise
            if process.returncode != 0 or "terminate called" in stderr:
                failures.append(f"run {i} rank {rank}: rc {process.returncode}: {stderr[-300:]}")
    assert not failures, f"{len(failures)} of {SHUTDOWN_RUNS} jobs failed at exit:\n" + "\n".join(failures[:3])
