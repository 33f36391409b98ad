"""ampkit.checkpoint._checks: what a load compares with the running setup before it changes anything."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ampkit import CheckpointError
from ampkit.checkpoint._checks import check_engine_state, check_model, check_optimizer, conforms


@pytest.mark.parametrize(
    "saved, reference",
    [
        (3, 2.5),  # a float setting saved as an int (lr=1 written by hand)
        (None, torch.zeros(2)),  # unset until first use on one side
        (torch.ones(2), None),
        ({"a": [1, 2.0], "b": "x"}, {"a": [0, 0.5], "b": "y"}),
        ((1, 2), [3, 4]),  # a tuple and a list are the same sequence
    ],
)
def test_what_conforms(saved: Any, reference: Any) -> None:
    conforms(saved, reference, "here")


@pytest.mark.parametrize(
    "saved, reference, message",
    [
        (2.5, 3, r"here is a float in the checkpoint, where this run has a int"),  # an int (a step count) must stay one
        (True, 1, r"here is a bool in the checkpoint, where this run has a int"),
        (1, True, r"here is a int in the checkpoint, where this run has a bool"),
        ("fast", 0.1, r"here is a str in the checkpoint, where this run has a float"),
        ({"a": 1, "c": 2}, {"a": 1, "b": 2}, r"here has other entries than this run's \(missing \['b'\], unexpected \['c'\]\)"),
        ([1, 2, 3], [1, 2], r"here holds 3 entries in the checkpoint, 2 in this run"),
        (torch.zeros(2, 3), torch.zeros(3, 2), r"here has shape \(2, 3\) in the checkpoint, \(3, 2\) in this run"),
        ({"m": {"v": 1.0}}, {"m": {"v": torch.zeros(1)}}, r"here\['m'\]\['v'\] is a float in the checkpoint, where this run has a tensor"),
    ],
)
def test_what_does_not_conform_is_named_with_where_it_is(saved: Any, reference: Any, message: str) -> None:
    with pytest.raises(CheckpointError, match=f"^{message}$"):
        conforms(saved, reference, "here")


def test_a_model_state_of_another_model_names_every_kind_of_difference() -> None:
    model = nn.Linear(3, 2)
    saved = {"weight": torch.zeros(4, 3), "bias": "not a tensor", "extra.weight": torch.zeros(1)}
    with pytest.raises(CheckpointError) as refused:
        check_model(0, model, saved, "ckpt.pt")
    assert str(refused.value) == (
        "ckpt.pt: model 0 does not match the checkpoint (missing [], unexpected ['extra.weight'], shape mismatch ['weight'], "
        "not tensors ['bias']). Build the same model as the saved run before engine.load()."
    )
    check_model(0, model, nn.Linear(3, 2).state_dict(), "ckpt.pt")  # the control: the same model's state passes


def test_optimizer_state_must_fit_its_parameter_elementwise_or_along_whole_dimensions() -> None:
    model = nn.Linear(6, 4, bias=False)
    opt = torch.optim.Adam(model.parameters())
    saved = opt.state_dict()  # fresh: no per-parameter state yet, so only the shapes are compared

    def with_state(value: torch.Tensor) -> dict[str, Any]:
        return {**saved, "state": {0: {"step": torch.tensor(1.0), "exp_avg": value}}}

    for fits in (torch.zeros(4, 6), torch.zeros(4, 1), torch.zeros(1, 6), torch.zeros(())):  # elementwise, factored, a counter
        check_optimizer(0, opt, with_state(fits), "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"state 'exp_avg' of parameter 0 has shape \(6, 4\), but the parameter has shape \(4, 6\)"):
        check_optimizer(0, opt, with_state(torch.zeros(6, 4)), "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"holds state for parameter 7, which none of its parameter groups lists"):
        check_optimizer(0, opt, {**saved, "state": {7: {"step": torch.tensor(1.0)}}}, "ckpt.pt")


def test_an_optimizer_state_of_another_class_is_refused_by_its_settings() -> None:
    model = nn.Linear(3, 2)
    adam = torch.optim.Adam(model.parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"group 0 has settings \['dampening', 'momentum'.*that Adam does not have; it was saved from another optimizer class"):
        check_optimizer(0, adam, sgd.state_dict(), "ckpt.pt")


def test_engine_counters_out_of_range_are_refused_as_a_damaged_file(trained) -> None:
    engine = trained()
    state = engine.state_dict()
    check_engine_state(engine, state)  # the control: its own state passes
    with pytest.raises(CheckpointError, match=r"counters are invalid \(skipped_steps=5 > steps=2\); the file is damaged"):
        check_engine_state(engine, {**state, "skipped_steps": 5})
    with pytest.raises(CheckpointError, match=r"counters are invalid \(accumulate=0, micro=True\)"):
        check_engine_state(engine, {**state, "accumulate": 0, "micro": True})


def test_a_state_of_another_policy_names_the_engine_to_build(trained) -> None:
    state = trained("bf16-mixed").state_dict()
    with pytest.raises(CheckpointError, match=r"written under policy 'bf16-mixed', but this engine runs '32-true'. Resume with Engine\(precision='bf16-mixed'\)"):
        check_engine_state(trained(), state)
