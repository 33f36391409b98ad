"""Tests for the ``ampkit`` entry point: version, help, error reporting and ``python -m ampkit``."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

import pytest
import torch

import ampkit
from ampkit._errors import AmpkitError, PolicyError
from ampkit.cli import _env as env_cmd
from ampkit.cli._main import main

VERSION_LINE = f"ampkit {ampkit.__version__} (torch {torch.__version__})"


def test_version_prints_ampkit_and_torch(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's version action exits by itself, with status 0.
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == VERSION_LINE


def test_no_subcommand_prints_help_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert "usage: ampkit" in captured.err
    assert "env" in captured.err


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "closest"), [(["bench", "--acumulate", "4"], "--accumulate"), (["env", "--jsn"], "--json"), (["memory", "--device-memroy=8GiB"], "--device-memory")]
)
def test_an_unknown_option_shows_its_commands_usage_and_the_closest_option(capsys: pytest.CaptureFixture[str], argv: list[str], closest: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: ampkit {argv[0]} [-h]")  # the command's usage, not ampkit's list of commands
    assert f"ampkit {argv[0]}: error: unrecognized arguments: {' '.join(argv[1:])} (did you mean {closest}?)" in err


def test_an_unknown_option_with_nothing_close_is_named_alone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--xyzzy"])
    assert capsys.readouterr().err.rstrip().endswith("ampkit bench: error: unrecognized arguments: --xyzzy")


@pytest.mark.parametrize(
    "error",
    [AmpkitError("boom"), PolicyError("boom"), ValueError("boom")],
    ids=["AmpkitError", "PolicyError", "ValueError"],
)
def test_user_errors_become_one_stderr_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: Exception
) -> None:
    def failing(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(env_cmd, "run", failing)
    assert main(["env"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "ampkit: error: boom\n"
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_multiline_error_is_joined_onto_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def failing(args: argparse.Namespace) -> int:
        raise AmpkitError("first line\n  second line\n")

    monkeypatch.setattr(env_cmd, "run", failing)
    assert main(["env"]) == 2
    assert capsys.readouterr().err == "ampkit: error: first line second line\n"


def test_real_policy_error_message_reaches_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # An error from ampkit itself, not a stand-in: the message keeps its "Did you mean" hint.
    def failing(args: argparse.Namespace) -> int:
        ampkit.get_policy("01")
        return 0

    monkeypatch.setattr(env_cmd, "run", failing)
    assert main(["env"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ampkit: error: Unknown precision '01'. Did you mean 'O1'?")
    assert err.count("\n") == 1


def test_bugs_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only user errors are softened; an unexpected exception must surface as itself.
    def failing(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(env_cmd, "run", failing)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["env"])


def test_python_dash_m_ampkit_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ampkit", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == VERSION_LINE


NOISY_USER = '''
import logging
import torch
from torch import nn

# As a model file importing transformers does on a CPU-only install: transformers imports torchao, whose import
# logs each CUDA kernel library it cannot load, and torch warns about torchao's pytree constants.
logging.getLogger("torchao").warning("Failed to load /site-packages/torchao/_C_cutlass_90a.abi3.so: Could not load this library")
logging.getLogger("torch.utils._pytree").warning(
    "<enum 'KernelPreference'> is an Enum subclass ... Calling register_constant() on Enum subclasses is deprecated")
logging.getLogger("torchao").warning("a torchao warning that is not import noise")

def model():
    return nn.Sequential(nn.Linear(8, 3))

def data():
    return [(torch.randn(4, 8), torch.randint(0, 3, (4,)))]
'''


def test_torchaos_import_noise_stays_out_of_a_command(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "noisy_user.py"
    path.write_text(NOISY_USER)
    with caplog.at_level(logging.WARNING):
        assert main(["memory", "--model", f"{path}:model", "--data", f"{path}:data", "--precision", "32-true", "--device", "cpu"]) == 0
    messages = [r.getMessage() for r in caplog.records]
    assert not any("Failed to load" in m or "register_constant()" in m for m in messages), messages
    assert "a torchao warning that is not import noise" in messages  # only the known noise is dropped
