"""ampkit.checkpoint._payload: what a checkpoint holds, and the undo that makes a failed load change nothing."""

from __future__ import annotations

import random

import pytest
import torch

from ampkit import CheckpointError, Engine
from ampkit.checkpoint._payload import Undo, apply_training_payload, load_engine_state, training_payload


def _counters(engine: Engine) -> dict[str, int]:
    state = engine.state_dict()
    return {k: state[k] for k in ("micro", "steps", "skipped_steps")}


def test_the_payload_is_each_parts_own_state(trained) -> None:
    engine = trained()
    payload = training_payload(engine, {"epoch": 3})
    assert payload.keys() == {"engine", "models", "optimizers", "schedulers", "rng", "extra"}
    # The control: each part's own state_dict(), taken now.
    assert payload["engine"] == engine.state_dict() and payload["extra"] == {"epoch": 3}
    model_state = engine.models[0].state_dict()
    assert all(torch.equal(payload["models"][0][k], v) for k, v in model_state.items()) and payload["models"][0].keys() == model_state.keys()
    assert payload["optimizers"][0]["param_groups"] == engine.optimizers[0].state_dict()["param_groups"]
    assert payload["schedulers"] == [engine.schedulers[0].state_dict()]
    assert torch.equal(payload["rng"]["torch"], torch.get_rng_state())
    sharded = training_payload(engine, None, tensors=False)  # a sharded save writes models and optimizers itself
    assert sharded["models"] is None and sharded["optimizers"] is None and sharded["engine"] == payload["engine"]


def test_before_setup_there_is_nothing_to_save() -> None:
    with pytest.raises(RuntimeError, match=r"engine.save\(\) called before engine.setup\(\)"):
        training_payload(Engine(), None)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"hook": print}, r"extra\['hook'\] holds a function \(print\)"),
        ({"seen": {1, 2}}, r"extra\['seen'\] holds a set"),
        ({"log": [1.0, {"when": torch.device("cpu")}]}, r"extra\['log'\]\[1\]\['when'\] holds a device"),
    ],
)
def test_extra_that_a_safe_load_would_refuse_is_refused_at_save(trained, extra, message) -> None:
    with pytest.raises(CheckpointError, match=message + ", which a safe \\(weights_only\\) load refuses"):
        training_payload(trained(), extra)


def test_an_error_part_way_through_a_load_puts_everything_back(trained, tensors, same) -> None:
    engine, other = trained(accumulate=2, micro_batches=3), trained(seed=1, micro_batches=4)
    before, counters, grads = tensors(engine), _counters(engine), [p.grad.clone() for p in engine.models[0].parameters()]
    lr, rng = engine.optimizers[0].param_groups[0]["lr"], (torch.get_rng_state(), random.getstate())
    failed = r"^loading the checkpoint failed part-way \(ValueError: a hook failed\); everything it had changed was restored"
    with pytest.raises(CheckpointError, match=failed), Undo(engine):
        apply_training_payload(engine, training_payload(other, None))  # a whole other run, applied
        torch.rand(3), random.random()  # the generators move on
        assert not same(tensors(engine), before)  # the load did change everything...
        raise ValueError("a hook failed")
    assert same(tensors(engine), before) and _counters(engine) == counters  # ...and all of it is back
    assert all(torch.equal(p.grad, g) for p, g in zip(engine.models[0].parameters(), grads))
    assert engine.optimizers[0].param_groups[0]["lr"] == lr
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1]


def test_an_interrupt_is_re_raised_as_it_is_after_the_undo(trained, tensors, same) -> None:
    engine, other = trained(), trained(seed=1)
    before = tensors(engine)
    with pytest.raises(KeyboardInterrupt), Undo(engine):
        apply_training_payload(engine, training_payload(other, None))
        raise KeyboardInterrupt
    assert same(tensors(engine), before)


def test_an_engine_state_that_does_not_fit_changes_nothing(trained) -> None:
    engine = trained()
    state = engine.state_dict()
    with pytest.raises(CheckpointError, match="counters are invalid"):
        load_engine_state(engine, {**trained(micro_batches=5).state_dict(), "micro": -1})
    assert engine.state_dict() == state
    load_engine_state(engine, trained(micro_batches=5).state_dict())
    assert engine.state_dict()["steps"] == 5
