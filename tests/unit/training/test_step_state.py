"""StepState: the counters a checkpoint keeps go through it under the checkpoint's keys; a load clears the outcome."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine
from ampkit.checkpoint._payload import apply_training_payload, training_payload
from ampkit.training._step_state import RING_SLOTS, StepState


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
    assert list(state) == ["policy", "accumulate", "micro", "epoch_len", "steps", "micro_batch_rows", "skipped_steps", "scaler", "masters", "pending_grads", "rounding"]
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


class _Landing:
    """A CUDA event's interface for a copy that lands when the test says so (query) or when waited for."""

    def __init__(self) -> None:
        self.landed = False
        self.waited = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.waited = self.landed = True


def _deferred(flags: list[float]) -> tuple[StepState, list[_Landing]]:
    state = StepState()
    for f in flags:
        state.record_outcome(torch.tensor(f), None)  # sent to the host, not read
    events = [_Landing() for _ in flags]
    state.deferred = [(slot, event, step) for (slot, _, step), event in zip(state.deferred, events)]  # as on CUDA: not landed yet
    return state, events


def test_poll_reads_the_flags_that_landed_in_order_and_waits_only_when_told() -> None:
    state, events = _deferred([0.0, 1.0, 0.0])
    assert state.found_host is None and state.skipped == 0
    events[0].landed = True
    assert state.poll(0) == [False]  # the second has not landed: stop there, wait for nothing
    assert not any(e.waited for e in events) and state.found_host is None and len(state.deferred) == 2
    assert state.poll(1) == [True]  # wait for the oldest one only
    assert events[1].waited and not events[2].waited and state.skipped == 1 and state.found_host is None
    events[2].landed = True
    assert state.poll(0) == [False] and state.deferred is None
    assert state.found_host is False  # the last step's own flag, once nothing newer is pending


def test_poll_without_a_limit_waits_for_every_flag_and_the_last_one_is_the_outcome() -> None:
    state, events = _deferred([1.0, 1.0])
    assert state.poll() == [True, True] and all(e.waited for e in events)
    assert state.found_host is True and state.skipped == 2 and state.deferred is None


def test_the_host_slots_are_reused_only_after_their_flag_was_read() -> None:
    state = StepState()
    for i in range(RING_SLOTS):
        state.record_outcome(torch.tensor(float(i % 2)), None)
    assert state.ring_full  # the engine waits for the oldest before sending another
    assert state.poll(0) == [bool(i % 2) for i in range(RING_SLOTS)] and not state.ring_full
    state.record_outcome(torch.tensor(1.0), None)  # the first slot again, holding the new flag
    assert state.poll() == [True] and state.skipped == RING_SLOTS // 2 + 1
