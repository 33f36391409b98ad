"""Choosing among tailored policies, and where tailoring starts."""

from __future__ import annotations

import pytest
import torch

from ampkit.numerics._compare import ModuleAgreement, StepComparison
from ampkit.numerics._recommend import PREFERENCE, Tailored, candidate_precisions, choose_precision, overflowing_modules
from ampkit.numerics._stats import StatsAccumulator
from ampkit.policy import get_policy


def _tailored(precision: str, *, finite: bool = True, diverging: tuple[str, ...] = ()) -> Tailored:
    modules = {
        name: ModuleAgreement(cosine=0.5 if name in diverging else 0.9999, rel_error=0.5 if name in diverging else 0.01,
                              nonfinite=not finite and name == "a", diverges=name in diverging or (not finite and name == "a"))
        for name in ("a", "b", "c")
    }
    comparison = StepComparison(label="recommended", policy=precision, keep_fp32=[], loss_scale=None, loss=1.0 if finite else None,
                                reference_loss=1.0, forward_origin=None, backward_origin=None, modules=modules)
    return Tailored(precision=precision, keep_fp32=[], loss_scale_log2=None, comparison=comparison)


def test_bf16_is_preferred_when_both_agree() -> None:
    assert choose_precision([_tailored("bf16-mixed"), _tailored("16-mixed")]).precision == "bf16-mixed"


def test_fp16_wins_when_only_it_agrees_with_fp32() -> None:
    chosen = choose_precision([_tailored("bf16-mixed", diverging=("b",)), _tailored("16-mixed")])
    assert chosen is not None and chosen.precision == "16-mixed"


def test_when_none_agrees_the_one_diverging_least_is_chosen_and_nonfinite_never() -> None:
    chosen = choose_precision([_tailored("bf16-mixed", diverging=("a", "b")), _tailored("16-mixed", diverging=("c",))])
    assert chosen is not None and chosen.precision == "16-mixed"
    assert choose_precision([_tailored("16-mixed", finite=False)]) is None


def test_tailoring_starts_from_the_innermost_overflowing_modules_in_forward_order() -> None:
    big, small = StatsAccumulator(), StatsAccumulator()
    big.update(torch.tensor([1e5]))
    small.update(torch.tensor([1.0]))
    stats = {
        "enc.fc": {"outputs": big.summary()}, "enc": {"outputs": big.summary()}, "dec.fc": {"outputs": small.summary()},
        "head": {"outputs": big.summary()}, "act": {"inputs": big.summary(), "outputs": big.summary()}, "": {"outputs": big.summary()},
    }
    order = ["enc.fc", "enc", "dec.fc", "head", "act", ""]
    # act only passes head's values on; the root cannot be kept apart; enc repeats enc.fc
    assert overflowing_modules(stats, "fp16", order) == ["enc.fc", "head"]
    assert overflowing_modules(stats, "bf16", order) == []


def test_cpu_candidates_leave_fp16_out_with_the_reason() -> None:
    fast, why = candidate_precisions(torch.device("cpu"))
    assert "16-mixed" not in fast
    assert any(w.startswith("16-mixed is slow on cpu") for w in why)


@pytest.mark.parametrize(
    "capability, name, expected",
    [((9, 0), "H100", ["bf16-mixed", "16-mixed"]), ((7, 5), "Tesla T4", ["16-mixed"]), ((6, 1), "GeForce GTX 1080", [])],
)
def test_gpu_candidates_follow_the_compute_capability(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], name: str, expected: list[str]
) -> None:
    """No bf16 below sm80, no tensor cores below sm70: the doctor only tries what runs fast (a fake GPU, so this
    runs without one, whatever the machine has)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    fast, why = candidate_precisions(torch.device("cuda", 0))
    assert fast == expected
    assert len(why) == 2 - len(expected) and all(name in w for w in why)


def test_candidates_on_the_pass_device_are_the_fast_supported_policies(device: torch.device) -> None:
    fast, why = candidate_precisions(device)
    assert fast == [p for p in PREFERENCE if get_policy(p).support(device).fast]
    assert len(fast) + len(why) == len(PREFERENCE)
