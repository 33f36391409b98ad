"""Kill-and-resume through the Trainer's own ``checkpoint-N``: a fresh Trainer resumed with ``resume_from_checkpoint``
draws the loss curve the uninterrupted run draws, bit for bit, with dropout and accumulation on, as the Trainer's own
bf16 run does (the control, run the same way, shows that any difference would be ampkit's). Preemption: a forked
process that receives SIGTERM in the middle of an accumulation window finishes that optimizer step, writes a normal
``checkpoint-N`` (the Trainer's files and ``ampkit_state.pt``), calls the user's own handler and exits with 75; the
resume from it continues the uninterrupted curve."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

import ampkit
from ampkit.training import REQUEUE_EXIT_CODE

VOCAB, SEQ, STEPS, SAVE_AT, ACCUMULATE = 64, 16, 8, 3, 2
TIMEOUT_S = 120

# name -> (Trainer class, TrainingArguments overrides, AmpkitTrainer arguments)
RUNS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "trainer bf16": ("native", {"bf16": True}, {}),
    "ampkit bf16-mixed": ("ampkit", {}, {"precision": "bf16-mixed"}),
    # the scale grows every 2 clean steps: a resume that lost it would go on at another scale
    "ampkit 16-mixed": ("ampkit", {}, {"precision": "16-mixed", "scaler": ampkit.ScalerConfig(init_scale=2.0**8, growth_interval=2)}),
    "ampkit bf16-true-masters": ("ampkit", {}, {"precision": "bf16-true-masters"}),
}


def _gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0))


def _dataset() -> Dataset:
    g = torch.Generator().manual_seed(1)
    ids = (torch.randint(0, VOCAB, (48, 1), generator=g) + torch.arange(SEQ)) % VOCAB
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def _trainer(name: str, out: str, callbacks: list[TrainerCallback] = (), **arg_overrides: Any) -> Trainer:
    """A fresh Trainer of the run ``name`` writing to ``out``: dropout (GPT-2's 0.1) and accumulation on."""
    from ampkit.transformers import AmpkitTrainer

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    kind, overrides, ampkit_args = RUNS[name]
    settings = dict(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=4, gradient_accumulation_steps=ACCUMULATE,
                    max_steps=STEPS, logging_steps=1, learning_rate=3e-3, save_strategy="steps", save_steps=SAVE_AT, seed=0,
                    max_grad_norm=1.0, disable_tqdm=True)
    args = TrainingArguments(**{**settings, **overrides, **arg_overrides})
    common = dict(model=_gpt2(), args=args, train_dataset=_dataset(), callbacks=list(callbacks))
    trainer = Trainer(**common) if kind == "native" else AmpkitTrainer(**common, **ampkit_args)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _losses(trainer: Trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("name", list(RUNS))
def test_a_fresh_trainer_resumed_from_checkpoint_n_continues_the_uninterrupted_curve(name: str, tmp_path: Path) -> None:
    whole = _trainer(name, str(tmp_path / "whole"))
    whole.train()
    folder = tmp_path / "whole" / f"checkpoint-{SAVE_AT}"
    assert (folder / "ampkit_state.pt").exists() == name.startswith("ampkit")
    resumed = _trainer(name, str(tmp_path / "whole"))
    resumed.train(resume_from_checkpoint=str(folder))
    want, got = _losses(whole), _losses(resumed)
    assert [got[s] for s in range(SAVE_AT + 1, STEPS + 1)] == [want[s] for s in range(SAVE_AT + 1, STEPS + 1)]
    for p, q in zip(_weights(resumed), _weights(whole)):
        assert torch.equal(p, q)
    if name.startswith("ampkit"):
        assert resumed.engine.steps == whole.engine.steps == STEPS and resumed.engine.scale == whole.engine.scale
    if name == "ampkit 16-mixed":
        assert whole.engine.scale > 2.0**8  # it moved, and the resume took it up where it was


def test_a_checkpoint_without_ampkit_state_resumes_with_a_warning_naming_what_restarts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    whole = _trainer("ampkit 16-mixed", str(tmp_path / "run"))
    whole.train()
    (tmp_path / "run" / f"checkpoint-{SAVE_AT}" / "ampkit_state.pt").unlink()
    resumed = _trainer("ampkit 16-mixed", str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{SAVE_AT}"))
    assert "has no ampkit_state.pt (written without ampkit)" in caplog.text and "loss scale starts at its initial value" in caplog.text


# ------------------------------------------------------------------------------------------------ preemption
class _SignalAt(TrainerCallback):
    """Sends SIGTERM to its own process in the middle of the accumulation window of step ``step`` + 1 (after its first
    micro-batch), or at the end of training (``step=None``): where a scheduler's signal may land."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step is None:
            os.kill(os.getpid(), signal.SIGTERM)


def _preempted_run(out: str, report: str, signal_step: int | None, save_strategy: str) -> None:
    """The user's script, in a forked process: its own SIGTERM handler, then train() until the signal."""
    torch.set_num_threads(1)
    calls: list[int] = []

    def users_handler(signum: int, frame: Any) -> None:
        calls.append(signum)

    signal.signal(signal.SIGTERM, users_handler)
    trainer = _trainer("ampkit 16-mixed", out, [_SignalAt(signal_step)], save_strategy=save_strategy)
    try:
        trainer.train()
    except SystemExit as stop:
        Path(report).write_text(json.dumps({"code": stop.code, "calls": calls, "restored": signal.getsignal(signal.SIGTERM) is users_handler,
                                            "step": trainer.state.global_step}))
        raise
    Path(report).write_text(json.dumps({"code": 0, "calls": calls}))


def _fork(target: Any, *args: Any) -> int:
    process = multiprocessing.get_context("forkserver").Process(target=target, args=args)
    process.start()
    process.join(TIMEOUT_S)
    if process.exitcode is None:
        process.kill()
        pytest.fail(f"{target.__name__} did not end within {TIMEOUT_S} s")
    return process.exitcode


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the forked run: the same kernels' reduction order
    try:
        trainer = _trainer("ampkit 16-mixed", str(tmp_path_factory.mktemp("uninterrupted")))
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return _losses(trainer)


def test_sigterm_mid_window_saves_checkpoint_n_exits_75_and_the_resume_continues_the_curve(tmp_path: Path, uninterrupted: dict[int, float]) -> None:
    out, report = str(tmp_path / "run"), tmp_path / "report.json"
    assert _fork(_preempted_run, out, str(report), 4, "no") == REQUEUE_EXIT_CODE  # save_strategy="no": only the preemption saves
    seen = json.loads(report.read_text())
    assert seen["code"] == REQUEUE_EXIT_CODE and seen["step"] == 5  # step 5's window finished, nothing after it
    assert seen["calls"] == [signal.SIGTERM] and seen["restored"]  # the user's handler chained once, and put back
    folder = Path(out) / "checkpoint-5"
    assert sorted(p.name for p in Path(out).iterdir()) == ["checkpoint-5"]
    assert {"ampkit_state.pt", "optimizer.pt", "scheduler.pt", "trainer_state.json", "model.safetensors"} <= {p.name for p in folder.iterdir()}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resumed = _trainer("ampkit 16-mixed", out)
        resumed.train(resume_from_checkpoint=True)  # the requeued job's call: the last checkpoint in output_dir
    finally:
        torch.set_num_threads(threads)
    got = _losses(resumed)
    assert [got[s] for s in range(6, STEPS + 1)] == [uninterrupted[s] for s in range(6, STEPS + 1)]


def test_a_signal_after_the_last_step_saves_when_train_returns(tmp_path: Path) -> None:
    out, report = str(tmp_path / "run"), tmp_path / "report.json"
    assert _fork(_preempted_run, out, str(report), None, "no") == REQUEUE_EXIT_CODE
    seen = json.loads(report.read_text())
    assert seen["step"] == STEPS and seen["restored"]
    assert (Path(out) / f"checkpoint-{STEPS}" / "ampkit_state.pt").exists()


def test_no_signal_no_exit_and_the_handler_is_put_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    trainer = _trainer("ampkit bf16-mixed", str(tmp_path / "run"), save_strategy="no")
    trainer.train()
    assert signal.getsignal(signal.SIGTERM) is before
    assert not list((tmp_path / "run").glob("checkpoint-*"))
