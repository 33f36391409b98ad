"""``ampkit profile`` end to end on CPU: a built-in workload with files written, the user's DataLoader profiled and
varied as given (its model's host sync found at its line), bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ampkit.cli._main import main

USER = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 3)

    def forward(self, x):
        if x.abs().max() > 100:  # a host sync in the model
            x = x.clamp(-100, 100)
        return self.body(x)

def model():
    torch.manual_seed(0)
    return Net()

class Slow(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.0005)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), int(i % 3)

def loader():
    return DataLoader(Slow(), batch_size=16)
"""


def test_a_builtin_workload_writes_json_report_plots_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    argv = ["profile", "-w", "gpt", "--size", "tiny", "--steps", "4", "--sync-steps", "1", "--trace-steps", "2", "--out", str(out), "--trace"]
    assert main(argv) == 0
    data = json.loads((out / "profile.json").read_text())
    assert data["command"].startswith("ampkit profile -w gpt") and data["workload"]["name"] == "gpt"
    assert data["precision"] == "bf16-mixed" and data["steps"] == 4 and data["trials"] == []  # gpt's batches are in memory
    assert list(data["phases"]) == ["data", "copy", "forward", "backward", "optimizer", "other"]
    assert data["ops"]["casts_per_step"] > 0 and data["trace"] == "trace.json"
    assert json.loads((out / "trace.json").read_text())["traceEvents"]
    assert (out / "phases.png").read_bytes().startswith(b"\x89PNG")
    report = (out / "report.md").read_text()
    assert "phases.png" in report and "trace.json" in report
    assert "Where the step's time goes" in capsys.readouterr().out


def test_the_users_dataloader_is_varied_as_given_and_the_models_sync_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "user_prof.py").write_text(textwrap.dedent(USER))
    monkeypatch.chdir(tmp_path)
    argv = ["profile", "--model", "user_prof:model", "--data", "user_prof:loader", "--precision", "32-true", "--steps", "4", "--sync-steps", "2", "--trace-steps", "0", "--out", "o"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "o" / "profile.json").read_text())
    names = [t["name"] for t in data["trials"]]
    assert names[0] == "as given" and "num_workers=1" in names and all(t["step_s"] > 0 for t in data["trials"])
    (site,) = data["syncs"]["sites"]
    assert site["code"].startswith("if x.abs().max() > 100:") and site["per_step"] == 1 and "user_prof.py" in site["where"]
    assert any(a["topic"] == "host syncs" and "torch.where" in a["change"] for a in data["advice"])
    assert (tmp_path / "o" / "trials.png").exists()


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["--model", "nets:build", "--data", "nets:loader", "--seed", "3", "--compile", "regional"],
         "--model nets:build --data nets:loader --seed 3 --compile regional"),
        (["--data", "nets:loader", "-w", "gpt", "--device", "cpu"], "--data nets:loader -w gpt --size small --device cpu"),
        (["--model", "nets:build", "-w", "gpt", "--size", "tiny", "--compile"], "--model nets:build -w gpt --size tiny --compile"),
        (["-w", "resnet"], "-w resnet --size small"),
    ],
)
def test_the_advices_bench_commands_run_the_profiled_workload(argv: list[str], flags: str) -> None:
    """The bench command the advice gives to confirm a change must reproduce what was profiled: every workload option
    given (--data without --model was dropped, and --seed and --compile with it)."""
    from ampkit.cli._main import build_parser
    from ampkit.cli._profile import _workload_flags

    args = build_parser().parse_args(["profile", *argv])
    size = args.size if args.size != "auto" else "small"
    assert _workload_flags(args, size) == flags + " "
    bench = build_parser().parse_args(["bench", *flags.split()])  # and bench takes them
    assert all(getattr(bench, k) == getattr(args, k) for k in ("model", "data", "workload", "seed", "device", "compile"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "-w", "gpt", "--size", "tiny", "--trace"], "--trace writes trace.json into --out DIR"),
        (["profile", "-w", "gpt", "--size", "tiny", "--precision", "fp17"], "fp17"),
        (["profile", "-w", "gtp"], "did you mean 'gpt'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
