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


class _Stop(Exception):
    """Raised by a stand-in for a command's work once it has seen its arguments."""


# Each command's precision, as the tool that does the work receives it: (command, module, attribute, the argument).
_TOOLS = [
    ("bench", "ampkit.cli._bench", "run_bench", lambda args, kwargs: args[1]),
    ("memory", "ampkit.cli._memory", "estimate", lambda args, kwargs: [args[3]]),
    ("doctor", "ampkit.numerics", "diagnose", lambda args, kwargs: [kwargs["target"]]),
    ("profile", "ampkit.profile._run", "profile_workload", lambda args, kwargs: [args[1]]),
]


@pytest.mark.parametrize(("command", "module", "name", "precisions_of"), _TOOLS, ids=[t[0] for t in _TOOLS])
def test_the_precision_is_resolved_once_on_the_command_line_and_the_tool_gets_policy_objects(
    command: str, module: str, name: str, precisions_of: Callable[..., list[object]], user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from ampkit.cli._main import main
    from ampkit.policy import Policy

    seen: list[object] = []

    def stand_in(*args: object, **kwargs: object) -> None:
        seen.extend(precisions_of(args, kwargs))
        raise _Stop

    monkeypatch.setattr(importlib.import_module(module), name, stand_in)
    with pytest.raises(_Stop):
        main([command, "--model", f"{user}:model", "--data", f"{user}:data", "--device", "cpu", "--precision", "bf16"])
    assert seen and all(isinstance(p, Policy) for p in seen), seen
    assert seen[-1].name == "bf16-mixed"  # type: ignore[attr-defined]
