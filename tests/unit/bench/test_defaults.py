"""Which policies a bench runs by default, and how --precision is read: as Policy objects, reference first."""

from __future__ import annotations

import pytest
import torch

from ampkit._errors import PolicyError, UnsupportedPolicyError
from ampkit.bench._defaults import default_precisions, resolve_precisions
from ampkit.policy import BF16Mixed, Policy

CPU = torch.device("cpu")


def test_cpu_default_is_the_reference_then_every_fast_policy() -> None:
    chosen, left_out = default_precisions(CPU)
    assert all(isinstance(p, Policy) for p in chosen) and chosen[0].name == "32-true"
    for policy in chosen[1:]:
        assert policy.support(CPU).fast
    # fp16 runs on a CPU but is slow there; it is left out with the reason, not silently.
    assert "16-mixed" in left_out and "slow" in left_out["16-mixed"]
    assert "tf32" in left_out and "16-mixed" not in [p.name for p in chosen]


def _names(policies: list[Policy]) -> list[str]:
    return [p.name for p in policies]


def test_precision_list_resolves_aliases_dedupes_and_puts_the_reference_first() -> None:
    assert _names(resolve_precisions("bf16,bf16-mixed, O0", CPU)) == ["32-true", "bf16-mixed"]
    assert _names(resolve_precisions("16-mixed,32", CPU)) == ["32-true", "16-mixed"]


def test_policy_objects_are_kept_as_given_beside_names() -> None:
    kept = BF16Mixed(keep_fp32=("head",))
    policies = resolve_precisions(["16-mixed", kept], CPU)
    assert _names(policies) == ["32-true", "16-mixed", "bf16-mixed"] and policies[2] is kept


def test_unknown_and_unsupported_policies_are_refused_with_what_to_do() -> None:
    with pytest.raises(PolicyError, match="O1"):
        resolve_precisions("01", CPU)
    with pytest.raises(UnsupportedPolicyError, match="tf32 cannot run on cpu.*bf16-mixed"):
        resolve_precisions("bf16,tf32", CPU)
    with pytest.raises(ValueError, match="names no policy"):
        resolve_precisions(" , ", CPU)
