"""What bench, doctor and memory read alike from their arguments: the device, the workload, the recorded command."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch


@pytest.mark.parametrize("device", ["meta", "gpu", "cuda:x"])  # a device type torch knows, one it does not, a bad index
@pytest.mark.parametrize(
    ("command", "choices"),
    [("bench", "runs on cpu, cuda or cuda:N"), ("doctor", "runs on cpu, cuda or cuda:N"), ("memory", "predicts for cpu or cuda")],
)
def test_a_device_the_command_does_not_run_on_is_refused_by_that_command_naming_the_choices(
    command: str, choices: str, device: str, cli_error: Callable[[list[str]], str]
) -> None:
    assert f"--device {device}: ampkit {command} {choices}." in cli_error([command, "--device", device])  # its own name


@pytest.mark.parametrize("command", ["bench", "doctor"])
def test_commands_that_run_on_the_device_refuse_cuda_when_there_is_none(command: str, cli_error: Callable[[list[str]], str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here, so --device cuda is valid")
    assert "--device cuda: CUDA is not available here" in cli_error([command, "--device", "cuda"])


@pytest.mark.parametrize(("command", "data_use"), [("bench", "train it on"), ("doctor", "run it on"), ("memory", "run it on")])
def test_a_model_without_data_or_workload_is_refused_before_it_is_imported(
    command: str, data_use: str, user: str, cli_error: Callable[[list[str]], str]
) -> None:
    err = cli_error([command, "--model", f"{user}:model"])
    assert f"--model without --data needs --workload NAME (the data to {data_use}), or --data pkg.module:factory." in err
    assert user not in sys.modules  # nothing of the user's ran for an input that cannot work
