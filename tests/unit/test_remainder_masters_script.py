"""benchmarks/remainder_masters.py in smoke mode: both policies train side by side, the remainder masters cost
2.125 B/param between steps and 8.125 inside, and the tie counter counts exactly the values that need the tie bit."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch


@pytest.fixture(scope="module")
def script(load_script: Callable[..., ModuleType]) -> ModuleType:
    return load_script("remainder_masters")


def test_the_tie_counter_counts_changed_values_that_round_down_to_even_from_exactly_halfway(script: ModuleType) -> None:
    tie_down = torch.tensor([1.0 + 2**-8]).view(torch.int32)  # halfway between 1 and its bf16 neighbour: RNE keeps 1
    tie_up = torch.tensor([1.0 + 3 * 2**-8]).view(torch.int32)  # halfway again, rounds up to the even neighbour
    values = torch.cat([tie_down, tie_up, tie_down + 1]).view(torch.float32)
    assert script.saturated_ties({"w": values}, {"w": torch.zeros(3)}) == 1
    assert script.saturated_ties({"w": values}, {"w": values.clone()}) == 0  # unchanged since: counted already


def test_smoke_run_trains_both_policies_and_measures_their_bytes(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert script.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "| bf16-true-masters | 8.000 | 8.000 |" in out
    assert "| bf16-true-remainder | 2.125 | 8.125 |" in out  # int16 remainder and a tie bit; inside the step the tie bits stay
    assert "ties met (held by the tie bit):" in out and "bitwise equal at every step" in out
