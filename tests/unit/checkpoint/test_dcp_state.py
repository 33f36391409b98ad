"""ampkit.checkpoint._dcp_state: the state a sharded checkpoint writes and reads, and the one-process switches."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine
from ampkit.checkpoint._dcp_state import grouped, optimizer_owner, sharded_state, single_process_intended


def _two_models() -> tuple[Engine, list[nn.Module], list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(2, 1)
    opts = [torch.optim.AdamW(a.parameters()), torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)]
    engine = Engine()
    models = engine.setup([a, b], *opts)[0]
    return engine, models, opts


def test_without_a_process_group_nothing_is_grouped() -> None:
    assert not grouped()


def test_the_state_holds_each_model_and_optimizer_under_its_index_keyed_by_parameter_name() -> None:
    engine, models, _ = _two_models()
    state = sharded_state(engine)
    assert sorted(state) == ["model.0", "model.1", "optim.0", "optim.1"]
    for i, model in enumerate(models):  # the control: each model's own state dict
        assert state[f"model.{i}"].keys() == model.state_dict().keys()
        assert all(torch.equal(state[f"model.{i}"][k], v) for k, v in model.state_dict().items())
    # By name, not by position: a resharded load finds each parameter's state whatever the order of the groups.
    assert state["optim.1"]["param_groups"][0]["params"] == ["weight", "bias"]
    assert state["optim.1"]["param_groups"][0]["momentum"] == 0.9


def test_an_optimizer_belongs_to_the_one_model_whose_parameters_it_holds() -> None:
    engine, models, opts = _two_models()
    assert optimizer_owner(engine, opts[0]) is models[0] and optimizer_owner(engine, opts[1]) is models[1]
    both = torch.optim.SGD([*models[0].parameters(), *models[1].parameters()], lr=0.1)
    with pytest.raises(CheckpointError, match="each optimizer to hold the parameters of one model; build one optimizer per model"):
        optimizer_owner(engine, both)


def test_single_process_intended_silences_only_dcps_warning_about_it() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with single_process_intended():
            warnings.warn("torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to ...", UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]
