"""ampkit memory's rows and progress: an estimable model prints no note; progress goes to stderr as bench's does."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampkit.cli._main import main

_MLP = '''
import torch
from torch import nn


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(2)]
'''


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    path = tmp_path / "mlp.py"
    path.write_text(_MLP)
    return ["memory", "--model", f"{path}:model", "--data", f"{path}:data", "--device", "cpu", "--precision", "32-true,bf16-mixed", *extra]


def test_an_estimable_model_prints_estimates_and_no_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_argv(tmp_path, "--no-progress")) == 0
    captured = capsys.readouterr()
    assert " 32-true " in captured.out and " 32-true* " not in captured.out and "not estimable" not in captured.out
    assert captured.err == ""  # --no-progress: nothing on stderr


def test_progress_off_a_terminal_is_a_line_per_policy_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_argv(tmp_path)) == 0  # pytest's stderr is no terminal: plain lines, as bench prints in a log
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "progress: 2 policies (one training step each on fake tensors, or measured where it cannot run there)"
    assert [line.split("] ", 1)[1] for line in lines[1:]] == [
        "0/2 policies: 32-true: estimating", "1/2 policies: 32-true: done", "1/2 policies: bf16-mixed: estimating",
        "2/2 policies: bf16-mixed: done", "2/2 policies: finished",
    ]
