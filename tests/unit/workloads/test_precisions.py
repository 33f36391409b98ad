"""A tool's list of precisions, made into Policy objects once: names, aliases and Policy objects alike."""

from __future__ import annotations

import pytest

from ampkit._errors import PolicyError
from ampkit.policy import BF16Mixed, Policy
from ampkit.workloads._precisions import parse_precisions


def test_names_and_aliases_become_policies_in_the_order_given_each_once() -> None:
    policies = parse_precisions("bf16, O1,bf16-mixed,,32")
    assert all(isinstance(p, Policy) for p in policies)
    assert [p.name for p in policies] == ["bf16-mixed", "16-mixed", "32-true"]


def test_a_policy_object_is_kept_as_given() -> None:
    kept = BF16Mixed(keep_fp32=("head",))
    (policy,) = parse_precisions([kept, "bf16"])  # the name given second is the same policy: it runs once
    assert policy is kept


def test_the_check_sees_each_item_as_typed() -> None:
    seen: list[tuple[str, str]] = []
    parse_precisions("fp16, bf16-mixed", check=lambda typed, policy: seen.append((typed, policy.name)))
    assert seen == [("fp16", "16-mixed"), ("bf16-mixed", "bf16-mixed")]


def test_an_unknown_name_and_an_empty_list_are_refused_naming_the_fix() -> None:
    with pytest.raises(PolicyError, match="Did you mean '16-mixed'"):
        parse_precisions("fp16-mixed")
    with pytest.raises(ValueError, match=r"^--precision ' , ' names no policy; give a comma-separated list such as 32-true,bf16-mixed\.$"):
        parse_precisions(" , ")
