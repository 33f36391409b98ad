"""Save on preemption, with real signals in forked processes: the preempted process exits with the requeue code right
after a checkpoint that holds every micro-batch it trained, a rerun resumes from it, and the final weights equal an
uninterrupted run's bit for bit; the user's handler is chained and put back.

The processes are forked from the session's preloaded server (``tests/conftest.py``): a fresh process in well under a
second, whose signal handlers are its own. Each run writes what it saw to a file; a preempted run writes it from the
user's handler and from the saved ``extra``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampkit
from ampkit.fileio import load_checkpoint
from ampkit.training import REQUEUE_EXIT_CODE, Preempted

MICRO = 24  # micro-batches of a whole run
ACCUMULATE = 3
TIMEOUT_S = 60  # a run takes well under a second: a hang fails the test instead of stalling the suite


def _build() -> tuple[ampkit.Engine, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Dropout(0.2), nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=MICRO)
    engine = ampkit.Engine("16-mixed", accumulate=ACCUMULATE, clip_grad_norm=1.0)  # a loss scale in the state too
    model, _ = engine.setup(model, opt, schedulers=sched)
    torch.manual_seed(1)  # the dropout stream, restored by load()
    return engine, model


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _train(ckpt: str, out: str, signal_at: int | None, phase: str) -> None:
    """The user's script: resume if a checkpoint exists, train MICRO micro-batches, write the weights to ``out``.
    ``signal_at``/``phase``: SIGTERM reaches the process at that micro-batch, at that point of it."""
    torch.set_num_threads(1)
    engine, model = _build()
    start = engine.load(ckpt)["micro"] if ampkit.checkpoint_exists(ckpt) else 0
    seen: list[int] = []

    def users_handler(signum: int, frame: Any) -> None:
        seen.append(engine.step_state.micro)  # micro-batches finished when the signal landed

    signal.signal(signal.SIGTERM, users_handler)
    kill = lambda where: os.kill(os.getpid(), signal.SIGTERM) if (i, where) == (signal_at, phase) else None
    trained = 0
    with engine.save_on_preemption(ckpt, extra=lambda: {"micro": i + 1, "seen": seen}):
        for i in range(start, MICRO):
            x, y = _batch(i)
            kill("forward")
            with engine.autocast():
                loss = nn.functional.cross_entropy(model(x).float(), y)
            kill("backward")
            engine.backward(loss)
            kill("step")
            engine.step()
            trained += 1
            kill("after step")
    restored = signal.getsignal(signal.SIGTERM) is users_handler
    torch.save({"params": [p.detach() for p in model.parameters()], "trained": trained, "start": start, "restored": restored}, out)


def _run(target: Any, *args: Any) -> int:
    process = multiprocessing.get_context("forkserver").Process(target=target, args=args)
    process.start()
    process.join(TIMEOUT_S)
    if process.exitcode is None:
        process.kill()
        pytest.fail(f"{target.__name__}{args} did not end within {TIMEOUT_S} s")
    return process.exitcode


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[torch.Tensor]:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    assert _run(_train, str(tmp / "ck.pt"), str(tmp / "out.pt"), None, "") == 0
    out = torch.load(tmp / "out.pt", weights_only=True)
    assert out["trained"] == MICRO and out["restored"]
    return out["params"]


@pytest.mark.parametrize("seed, phase", list(enumerate(["forward", "backward", "step", "after step"])))
def test_sigterm_saves_the_step_in_flight_exits_to_be_requeued_and_the_rerun_ends_bitwise_equal(
    tmp_path: Path, seed: int, phase: str, uninterrupted: list[torch.Tensor]
) -> None:
    signal_at = random.Random(seed).randrange(MICRO - 1)  # any micro-batch: mid-window or at its end
    ckpt, out = str(tmp_path / "last.pt"), str(tmp_path / "out.pt")

    assert _run(_train, ckpt, out, signal_at, phase) == REQUEUE_EXIT_CODE
    assert not Path(out).exists()  # it stopped: the loop did not go on
    saved = load_checkpoint(ckpt)
    seen = saved["extra"]["seen"]
    assert len(seen) == 1, "the user's handler is called once, after ours"
    # Nothing lost but the micro-batch in flight: the checkpoint holds every micro-batch finished when the signal came,
    # and the one running then, and the process trained nothing after it.
    assert saved["extra"]["micro"] == seen[0] + 1 == saved["engine"]["micro"]

    assert _run(_train, ckpt, out, None, "") == 0  # the requeued run
    resumed = torch.load(out, weights_only=True)
    assert resumed["start"] == saved["extra"]["micro"] and resumed["start"] + resumed["trained"] == MICRO
    assert resumed["restored"]
    for a, b in zip(resumed["params"], uninterrupted):
        assert torch.equal(a, b)


def _signal_after_the_loop(ckpt: str) -> None:
    engine, model = _build()
    with engine.save_on_preemption(ckpt, signals=(signal.SIGUSR1,), exit_code=99):
        for i in range(ACCUMULATE + 1):  # ends inside a window
            engine.backward(model(_batch(i)[0]).float().sum())
            engine.step()
        os.kill(os.getpid(), signal.SIGUSR1)  # say, during an evaluation after the loop, inside the context
    raise AssertionError("the context's end saves and exits")


def test_a_signal_after_the_last_step_saves_when_the_context_ends(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.pt"
    assert _run(_signal_after_the_loop, str(ckpt)) == 99
    saved = load_checkpoint(ckpt)
    assert (saved["engine"]["steps"], saved["engine"]["micro"]) == (1, ACCUMULATE + 1)
    assert saved["engine"]["pending_grads"] is not None  # the unfinished window's gradients, as save() keeps them


# ------------------------------------------------------------------------------------------ in this process, no signal sent
def _engine() -> tuple[ampkit.Engine, nn.Module]:
    engine = ampkit.Engine()
    model = nn.Linear(2, 1)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return engine, model


def test_leaving_the_context_puts_the_previous_handlers_back(tmp_path: Path) -> None:
    engine, _ = _engine()

    def mine(signum: int, frame: Any) -> None: ...

    before = signal.signal(signal.SIGUSR2, mine)
    try:
        with engine.save_on_preemption(tmp_path / "ck.pt", signals=(signal.SIGUSR2,)):
            assert signal.getsignal(signal.SIGUSR2) is not mine
        assert signal.getsignal(signal.SIGUSR2) is mine
        with pytest.raises(KeyError), engine.save_on_preemption(tmp_path / "ck.pt", signals=(signal.SIGUSR2,)):
            raise KeyError("an error in the loop")
        assert signal.getsignal(signal.SIGUSR2) is mine
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert not (tmp_path / "ck.pt").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"signals": (signal.SIGKILL,)}, "SIGKILL cannot be caught"),
    ({"signals": signal.SIGTERM}, "a tuple of signals"),
    ({"exit_code": 0}, "0 says the job is finished"),
    ({"exit_code": 256}, "from 1 to 255"),
    ({"extra": [1]}, "a dict or a function"),
])
def test_what_cannot_work_is_refused_with_the_fix(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    engine, _ = _engine()
    with pytest.raises((ValueError, TypeError), match=message):
        engine.save_on_preemption(tmp_path / "ck.pt", **kwargs)


def test_the_context_is_entered_once_after_setup_in_the_main_thread(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="after engine.setup"):
        ampkit.Engine().save_on_preemption(tmp_path / "ck.pt").__enter__()
    engine, _ = _engine()
    with engine.save_on_preemption(tmp_path / "ck.pt"), pytest.raises(RuntimeError, match="active already"):
        engine.save_on_preemption(tmp_path / "ck.pt").__enter__()
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            engine.save_on_preemption(tmp_path / "ck.pt").__enter__()
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert "main thread" in str(errors[0])
    with engine.save_on_preemption(tmp_path / "ck.pt"):  # none of the refusals left it attached
        pass


def test_preempted_is_a_system_exit_with_the_code() -> None:
    exit_ = Preempted(REQUEUE_EXIT_CODE, "runs/last.pt", steps=3)
    assert isinstance(exit_, SystemExit) and not isinstance(exit_, Exception) and exit_.code == 75
