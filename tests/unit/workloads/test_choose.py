"""The rules that turn a tool's workload options into one workload, the same for every tool."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ampkit.workloads import _choose as choose, choose_workload, get_workload

CPU = torch.device("cpu")

USER = """
import torch
from torch import nn

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))  # fits resnet's tiny images too

def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(12)]
"""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "choose_user.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "choose_user", raising=False)
    return "choose_user"


def test_nothing_named_is_the_devices_default_built_in_workload_with_its_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, dict[str, object]]] = []
    resnet = get_workload("resnet", size="tiny")

    def spy(name: str, **kwargs: object) -> object:
        asked.append((name, kwargs))
        return resnet

    monkeypatch.setattr(choose, "get_workload", spy)
    chosen = choose_workload(size="tiny", seed=3, device=CPU)
    assert asked == [("digits", {"size": "tiny", "seed": 3, "batch_size": None})]  # the CPU's default (defaults.py)
    assert (chosen.steps, chosen.warmup) == (resnet.steps, resnet.warmup)  # its own


def test_the_tools_steps_warm_up_and_accumulation_win() -> None:
    chosen = choose_workload("gpt", size="tiny", device=CPU, steps=7, warmup=2, accumulate=3)
    assert (chosen.steps, chosen.warmup, chosen.accumulate) == (7, 2, 3)


def test_the_users_data_gets_100_steps_and_is_read_for_every_micro_batch(user: str) -> None:
    chosen = choose_workload(model=f"{user}:model", data=f"{user}:data", device=CPU, accumulate=2)
    assert (chosen.steps, chosen.warmup) == (100, 5)
    assert len(chosen.train_batches) == 12  # all it has: fewer than steps * accumulate
    few = choose_workload(model=f"{user}:model", data=f"{user}:data", device=CPU, steps=3, warmup=1, accumulate=2)
    assert len(few.train_batches) == 3 * 2


def test_a_model_alone_trains_on_a_built_in_workloads_data_and_steps(user: str) -> None:
    chosen = choose_workload("resnet", f"{user}:model", size="tiny", device=CPU)
    control = get_workload("resnet", size="tiny")
    assert chosen.name == f"{user}:model on resnet" and isinstance(chosen.model, torch.nn.Sequential)
    assert (chosen.steps, chosen.warmup) == (control.steps, control.warmup)
    assert torch.equal(chosen.batch(0)[0], control.batch(0)[0])


def test_what_cannot_work_is_refused_before_the_users_code_runs(user: str) -> None:
    with pytest.raises(ValueError, match=r"^--model without --data needs --workload NAME \(the data to profile it on\)"):
        choose_workload(model=f"{user}:model", device=CPU, data_use="profile it on")
    assert user not in sys.modules
    with pytest.raises(ValueError, match="--batch-size 8 applies to a built-in workload's data"):
        choose_workload(model=f"{user}:model", data=f"{user}:data", device=CPU, batch_size=8)
    with pytest.raises(ValueError, match="needs --model"):
        choose_workload(data=f"{user}:data", device=CPU)
