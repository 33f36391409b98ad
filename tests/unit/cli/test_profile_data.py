"""``ampkit profile`` measures the data phase on the user's own loader however ``--data`` passes it: a DataLoader,
a :class:`~ampkit.workloads.BenchData` wrapping one, a generator (read once: no trials, said so)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from ampkit.cli._main import main
from ampkit.profile import try_loader_settings

SLEEP_S = 0.008
"""Each batch of the users' loader sleeps this long: the data phase's floor (a sleep never returns early)."""

USER = f"""
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from ampkit.bench import BenchData

def model():
    torch.manual_seed(0)
    return nn.Linear(8, 3)

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep({SLEEP_S} / 4)  # four samples a batch: {SLEEP_S} s a batch
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), int(i % 3)

def wrapped():
    return BenchData(train=DataLoader(Slow(), batch_size=4), loss_fn=nn.functional.cross_entropy)

def generated():
    def batches():
        for i in range(40):
            time.sleep({SLEEP_S})
            yield torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    return batches()

class Stream:  # re-iterable, no length: a reader of files, say
    def __iter__(self):
        for i in range(6):
            time.sleep({SLEEP_S})
            yield torch.randn(4, 8), torch.tensor([0, 1, 2, 0])

def streamed():
    return Stream()

def short():
    return ((torch.randn(4, 8), torch.tensor([0, 1, 2, 0])) for _ in range(5))
"""

STEPS = ["--warmup", "1", "--plain-steps", "2", "--steps", "4", "--sync-steps", "1", "--trace-steps", "0", "--precision", "32-true"]


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "user_data.py").write_text(textwrap.dedent(USER))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _data_phase(data: dict[str, Any]) -> float:
    return data["phases"]["data"]["median_s"]


def test_a_benchdata_wrapped_loader_is_read_as_trained_and_its_settings_tried(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ampkit.profile import _run

    tried = []

    def one_variant(loader: Any, step: Any, device: Any, **kwargs: Any) -> list[Any]:
        tried.append(loader)  # the real trials, the loader as given only: the search's worker processes take seconds
        return try_loader_settings(loader, step, device, settings=[], **kwargs)

    monkeypatch.setattr(_run, "try_loader_settings", one_variant)
    assert main(["profile", "--model", "user_data:model", "--data", "user_data:wrapped", *STEPS, "--out", "o"]) == 0
    data = json.loads((user / "o" / "profile.json").read_text())
    # The sleep is the floor of the wait; the ceiling is loose (a shared CI machine), but a pre-read list waits ~0.
    assert SLEEP_S * 0.95 <= _data_phase(data) <= SLEEP_S * 4
    (loader,) = tried
    assert isinstance(loader, DataLoader) and type(loader.dataset).__name__ == "Slow"  # the user's own loader, not a copy in memory
    (trial,) = data["trials"]
    assert trial["name"] == "as given" and trial["step_s"] >= SLEEP_S * 0.95 and "trials_note" not in data  # timed on the real loader
    err = capsys.readouterr().err  # the progress: the trial a line as it starts, then the end
    assert "DataLoader trial: as given" in err and err.rstrip().endswith("finished")


def test_a_generator_is_profiled_as_read_and_its_trials_are_said_impossible(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "user_data:model", "--data", "user_data:generated", *STEPS, "--out", "o"]) == 0
    data = json.loads((user / "o" / "profile.json").read_text())
    assert SLEEP_S * 0.95 <= _data_phase(data) <= SLEEP_S * 4
    assert data["trials"] == [] and "read only once" in data["trials_note"]
    assert "read only once" in capsys.readouterr().out


def test_a_stream_without_a_length_is_read_as_it_streams_epoch_after_epoch(user: Path) -> None:
    assert main(["profile", "--model", "user_data:model", "--data", "user_data:streamed", *STEPS, "--out", "o"]) == 0
    data = json.loads((user / "o" / "profile.json").read_text())
    assert SLEEP_S * 0.95 <= _data_phase(data) <= SLEEP_S * 4  # 6 batches an epoch, read again for the 8 steps
    assert data["trials"] == [] and "not a DataLoader" in data["trials_note"]


def test_a_generator_too_short_for_the_phases_is_refused_naming_the_count(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "user_data:model", "--data", "user_data:short", *STEPS]) == 2
    err = capsys.readouterr().err
    assert "read only once" in err and "7 batches" in err
