"""StepState: the counters a checkpoint keeps go through it under the checkpoint's keys; a load clears the outcome."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine
from ampkit.checkpoint.payload import apply_training_payload, training_payload
from ampkit.training.step_state import StepState


def _run(micro_batches: int, *, poison_last: bool = False) -> Engine:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = Engine(accumulate=2, skip_nonfinite=True)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for i in range(micro_batches):
        engine.backward(model(torch.randn(3, 4)).pow(2).mean())
        if poison_last and i == micro_batches - 1:
            model.weight.grad[0, 0] = float("inf")
        engine.step()
    return engine


def test_to_dict_and_from_dict_round_trip_the_counters_only() -> None:
    state = StepState(micro=7, epoch_len=9, steps=3, found_host=True, norm=torch.ones(()), diagnose_late=True)
    back = StepState.from_dict(state.to_dict())
    assert back.to_dict() == state.to_dict() == {"micro": 7, "epoch_len": 9, "steps": 3}
    assert (back.found_host, back.norm, back.deferred, back.diagnose_late) == (None, None, None, False)


def test_the_engine_state_keeps_the_checkpoint_keys_and_the_engine_attributes_read_its_step_state() -> None:
    engine = _run(5)
    state = engine.state_dict()
    # The file format: these keys, in this order, as every earlier version wrote them.
    assert list(state) == ["policy", "accumulate", "micro", "epoch_len", "steps", "micro_batch_rows", "skipped_steps", "scaler", "masters", "pending_grads"]
    assert (state["micro"], state["epoch_len"], state["steps"]) == (engine.step_state.micro, engine.step_state.epoch_len, engine.steps) == (5, None, 2)
    assert engine.micro_batches_pending == 1 and state["pending_grads"] is not None


def test_a_load_restores_the_counters_and_clears_the_last_steps_outcome() -> None:
    writer = _run(5)
    reader = _run(4, poison_last=True)
    assert reader.step_was_skipped
    reader.load_state_dict(writer.state_dict())
    assert reader.step_state.to_dict() == writer.step_state.to_dict()
    assert reader.micro_batches_pending == writer.micro_batches_pending == 1
    assert not reader.step_was_skipped and reader.step_state.found_host is None


def test_a_load_that_fails_part_way_puts_the_step_state_and_its_outcome_back() -> None:
    writer, reader = _run(5), _run(4, poison_last=True)
    before = copy.copy(reader.step_state)
    payload = training_payload(writer, None)
    payload["engine"]["pending_grads"] = {"no.such.parameter": torch.zeros(2, 4)}  # fails after the counters are set
    with pytest.raises(CheckpointError, match="restored"):
        apply_training_payload(reader, payload)
    assert reader.step_state == before and reader.step_state.found_host is True
