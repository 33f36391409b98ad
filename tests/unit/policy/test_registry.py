"""The policy registry: every name and alias resolves, and every mistake is answered with the fix."""

from __future__ import annotations

import pytest
from torch import nn

from ampkit._errors import PolicyError
from ampkit._util.policy_names import POLICY_NAMES
from ampkit.policy import (
    ALIASES,
    POLICIES,
    BF16Mixed,
    BF16True,
    BF16TrueKahan,
    BF16TrueMasters,
    BF16TrueRemainder,
    BF16TrueSR,
    FP8Rowwise,
    FP8Tensorwise,
    FP16Mixed,
    FP16True,
    FP16TrueMasters,
    FullPrecision,
    Policy,
    TF32Precision,
    get_policy,
    policy_names,
)

# Written out by hand rather than read from ALIASES, so a wrong entry in the table fails here.
EXPECTED_ALIASES = {
    "O0": "32-true",
    "O1": "16-mixed",
    "O2": "16-true-masters",
    "O3": "16-true",
    "fp16": "16-mixed",
    "16": "16-mixed",
    "float16": "16-mixed",
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "no": "32-true",
    "fp32": "32-true",
    "32": "32-true",
    "float32": "32-true",
    "fp8": "fp8-tensorwise",
}

EXPECTED_CLASSES: dict[str, type[Policy]] = {
    "32-true": FullPrecision,
    "tf32": TF32Precision,
    "bf16-mixed": BF16Mixed,
    "16-mixed": FP16Mixed,
    "bf16-true": BF16True,
    "16-true": FP16True,
    "bf16-true-masters": BF16TrueMasters,
    "bf16-true-remainder": BF16TrueRemainder,
    "bf16-true-kahan": BF16TrueKahan,
    "bf16-true-sr": BF16TrueSR,
    "16-true-masters": FP16TrueMasters,
    "fp8-tensorwise": FP8Tensorwise,
    "fp8-rowwise": FP8Rowwise,
}


# ------------------------------------------------------------------------------------- names that resolve
def test_policy_names_are_the_canonical_names_in_table_order() -> None:
    assert policy_names() == list(EXPECTED_CLASSES)
    assert list(POLICIES) == list(EXPECTED_CLASSES)


def test_policy_names_returns_a_copy_the_caller_may_mutate() -> None:
    names = policy_names()
    names.clear()
    assert policy_names() == list(EXPECTED_CLASSES)


@pytest.mark.parametrize("name", list(EXPECTED_CLASSES))
def test_every_canonical_name_resolves_to_its_class(name: str) -> None:
    policy = get_policy(name)
    assert type(policy) is EXPECTED_CLASSES[name]
    assert policy.name == name
    assert policy.keep_fp32 == ()


@pytest.mark.parametrize("alias, canonical", sorted(EXPECTED_ALIASES.items()))
def test_every_alias_resolves_to_its_canonical_policy(alias: str, canonical: str) -> None:
    policy = get_policy(alias)
    assert policy.name == canonical
    assert type(policy) is EXPECTED_CLASSES[canonical]


def test_alias_table_is_exactly_the_documented_one() -> None:
    assert ALIASES == EXPECTED_ALIASES
    assert set(ALIASES.values()) <= set(POLICIES)
    assert not set(ALIASES) & set(POLICIES), "an alias must not shadow a canonical name"


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        ("o1", "16-mixed"),
        ("o2", "16-true-masters"),
        ("BF16", "bf16-mixed"),
        ("Bf16-Mixed", "bf16-mixed"),
        ("TF32", "tf32"),
        ("NO", "32-true"),
        ("  bf16  ", "bf16-mixed"),
        ("\tO3\n", "16-true"),
        (" 16-TRUE-MASTERS ", "16-true-masters"),
    ],
)
def test_names_are_case_insensitive_and_whitespace_stripped(spelling: str, canonical: str) -> None:
    assert get_policy(spelling).name == canonical


@pytest.mark.parametrize("number, canonical", [(16, "16-mixed"), (32, "32-true")])
def test_ints_16_and_32_resolve_like_their_strings(number: int, canonical: str) -> None:
    policy = get_policy(number)
    assert policy.name == canonical
    assert type(policy) is type(get_policy(str(number)))


# ------------------------------------------------------------------------------------- Policy objects, keep_fp32
def test_a_policy_passes_through_unchanged() -> None:
    policy = BF16Mixed(keep_fp32=("head",))
    assert get_policy(policy) is policy


def test_keep_fp32_is_stored_as_a_tuple_in_order() -> None:
    policy = get_policy("bf16", keep_fp32=["head", nn.LayerNorm, "blocks.*.attn"])
    assert policy.keep_fp32 == ("head", nn.LayerNorm, "blocks.*.attn")
    assert isinstance(policy.keep_fp32, tuple)


def test_keep_fp32_is_appended_to_a_policy_s_own_without_mutating_it() -> None:
    original = get_policy("16-true-masters", keep_fp32=["head"])
    extended = get_policy(original, keep_fp32=["decoder.out", nn.GroupNorm])
    assert extended.keep_fp32 == ("head", "decoder.out", nn.GroupNorm)
    assert type(extended) is type(original) and extended.name == original.name
    assert original.keep_fp32 == ("head",)
    assert extended is not original


def test_keep_fp32_accepts_any_iterable() -> None:
    assert get_policy("bf16", keep_fp32=(n for n in ["a", "b"])).keep_fp32 == ("a", "b")


def test_keep_fp32_given_a_bare_string_is_one_name_not_its_characters() -> None:
    policy = get_policy("bf16", keep_fp32="head")
    assert policy.keep_fp32 == ("head",)


# ------------------------------------------------------------------------------------- mistakes
def _error(precision: object) -> str:
    with pytest.raises(PolicyError) as info:
        get_policy(precision)  # type: ignore[arg-type]
    return str(info.value)


def test_policy_error_is_a_value_error() -> None:
    assert issubclass(PolicyError, ValueError)
    with pytest.raises(ValueError):
        get_policy("nonsense")


def test_unknown_name_lists_every_valid_name_and_alias() -> None:
    message = _error("nonsense")
    assert "Unknown precision 'nonsense'" in message
    for name in [*POLICIES, *ALIASES]:
        assert name in message


def test_unrelated_name_gets_no_suggestion() -> None:
    assert "Did you mean" not in _error("xyzzy")


@pytest.mark.parametrize("typed, suggested", [("00", "O0"), ("01", "O1"), ("02", "O2"), ("03", "O3")])
def test_digit_zero_for_letter_o_suggests_the_apex_level(typed: str, suggested: str) -> None:
    assert f"Did you mean {suggested!r}?" in _error(typed)


@pytest.mark.parametrize(
    "typed, suggested",
    [
        ("bf61-mixed", "bf16-mixed"),
        ("bf16-mix", "bf16-mixed"),
        ("16-mixd", "16-mixed"),
        ("32-treu", "32-true"),
        ("tf23", "tf32"),
        ("fp61", "fp16"),
        ("bf16-true-master", "bf16-true-masters"),
        ("BF61-MIXED", "bf16-mixed"),
    ],
)
def test_typo_suggests_the_closest_name(typed: str, suggested: str) -> None:
    assert f"Did you mean {suggested!r}?" in _error(typed)


@pytest.mark.parametrize(
    "typed, suggested",
    [
        ("fp16-mixed", "16-mixed"),  # one letter from bf16-mixed, but a user who types fp16 means fp16
        ("FP16_Mixed", "16-mixed"),
        ("half-mixed", "16-mixed"),
        ("half", "16-mixed"),
        ("float16-true", "16-true"),
        ("fp16-true-masters", "16-true-masters"),
        ("fp32-true", "32-true"),
        ("float32-true", "32-true"),
        ("bfloat16-true", "bf16-true"),
        ("fp16-mixd", "16-mixed"),
    ],
)
def test_a_dtype_spelt_another_way_suggests_that_dtypes_policy(typed: str, suggested: str) -> None:
    assert f"Did you mean {suggested!r}?" in _error(typed)


def test_the_registry_holds_a_class_for_every_name_the_command_line_checks() -> None:
    # The command line refuses unknown names before importing torch, from the names alone.
    assert list(POLICIES) == list(POLICY_NAMES)


def test_suggestion_uses_the_canonical_spelling() -> None:
    # The lookup is lower-cased; the hint must still read 'O3', the name the docs use, and must itself resolve.
    message = _error("o4")
    hint = message.split("Did you mean ", 1)[1].split("?", 1)[0].strip("'")
    assert hint in ALIASES or hint in POLICIES  # case-sensitive: 'o3' would fail
    get_policy(hint)


def test_unknown_int_is_refused_with_the_list() -> None:
    message = _error(8)
    assert "Unknown precision 8" in message and "32-true" in message


@pytest.mark.parametrize("bad", [True, False, None, 16.0, 32.0, b"bf16", ["bf16"], nn.Linear])
def test_non_name_inputs_raise_policy_error(bad: object) -> None:
    message = _error(bad)
    assert "precision must be a policy name" in message
    assert type(bad).__name__ in message


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        ([5], "keep_fp32 entry 0 is int 5"),
        (["head", None], "keep_fp32 entry 1 is NoneType None"),
        ([nn.Linear(2, 2)], "keep_fp32 entry 0 is Linear"),  # an instance, not the type
        ([int], "keep_fp32 entry 0 is type <class 'int'>"),
        (5, "keep_fp32 takes a list of module names"),
        ({"head": 1}, "keep_fp32 takes a list of module names"),
    ],
)
def test_bad_keep_fp32_entries_are_refused_where_the_policy_resolves(keep: object, message: str) -> None:
    # Refused at resolution, before any model is seen: a policy that is never applied to a model (32-true with
    # nothing to convert, a policy stored in a config) would otherwise carry the bad entry silently.
    for name in ("bf16-mixed", "32-true"):
        with pytest.raises(PolicyError) as info:
            get_policy(name, keep_fp32=keep)
        assert message in str(info.value) and "nn.Module subclasses such as nn.LayerNorm" in str(info.value)


def test_with_keep_fp32_checks_its_entries_too() -> None:
    with pytest.raises(PolicyError, match="keep_fp32 entry 1 is int 5"):
        get_policy("16-mixed").with_keep_fp32("head", 5)
