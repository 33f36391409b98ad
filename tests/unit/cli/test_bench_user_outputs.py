"""Every tool refuses, in one line naming the fix, a user's model whose output or labels the default loss would
read wrongly: a dict with neither ``loss`` nor ``logits`` (never trained on its first tensor), and a label past the
model's classes (named, not a raw ``IndexError``). The twins train."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from ampkit.cli._main import main

USER = """
import torch
from torch import nn
from ampkit.bench import BenchData

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        h = self.a(x)
        return {"hidden": h, "scores": self.b(torch.relu(h))}

def model():
    torch.manual_seed(0)
    return Net()

def linear():
    torch.manual_seed(0)
    return nn.Linear(8, 3)

def _batches(n, bad=None):
    g = torch.Generator().manual_seed(0)
    out = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)]
    if bad is not None:
        out[bad][1][-1] = 7
    return out

def data():
    return _batches(4)

def scores_data():
    return BenchData(train=_batches(4), loss_fn=lambda out, y: nn.functional.cross_entropy(out["scores"], y))

def label_7():
    return _batches(4, bad=0)
"""

COMMANDS = {
    "bench": ["--steps", "2", "--warmup", "1", "--precision", "32-true", "--no-progress"],
    "memory": [],
    "doctor": ["--steps", "1"],
    "profile": [],
    "tune": [],
}


@pytest.fixture
def outputs_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "outputs_user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "outputs_user", raising=False)
    monkeypatch.chdir(tmp_path)
    return "outputs_user"


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ampkit: error: ") and "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_tool_refuses_a_dict_output_without_loss_or_logits_naming_its_keys_and_loss_fn(
    command: str, outputs_user: str, capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: every tool trained cross-entropy on "hidden" (16 wide, the first value) against 3-class labels, silently.
    err = _refused(capsys, [command, "--model", f"{outputs_user}:model", "--data", f"{outputs_user}:data", "--device", "cpu"])
    assert f"--model {outputs_user}:model: the model returned a dict with keys 'hidden', 'scores' and neither 'loss' nor 'logits'" in err
    assert "BenchData(loss_fn=...)" in err and "out['scores']" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_tool_names_a_label_past_the_models_classes(command: str, outputs_user: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, [command, "--model", f"{outputs_user}:linear", "--data", f"{outputs_user}:label_7", "--device", "cpu"])
    assert f"--data {outputs_user}:label_7: training batch 0 has label 7, but the model outputs 3 classes" in err
    assert "IndexError" not in err


def test_the_same_dict_output_with_the_loss_fn_the_error_names_trains(outputs_user: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--model", f"{outputs_user}:model", "--data", f"{outputs_user}:scores_data", "--device", "cpu", *COMMANDS["bench"]]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "32-true" in out.out and "error" not in out.err
