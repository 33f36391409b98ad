"""The one place policy names and their aliases are resolved.

Canonical names follow the ecosystem (Lightning's ``32-true``, ``bf16-mixed``, ...); aliases cover what users
type elsewhere: Accelerate's ``no``/``fp16``/``bf16``, bare dtypes, and Apex's opt levels ``O0``-``O3``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from torch import nn

from ..errors import PolicyError
from .base import Policy
from .fp8 import FP8Rowwise, FP8Tensorwise
from .full import FullPrecision, TF32Precision
from .half import BF16True, BF16TrueMasters, BF16TrueRemainder, FP16True, FP16TrueMasters
from .islands import check_keep_fp32
from .lowbit import BF16TrueKahan, BF16TrueSR
from .mixed import BF16Mixed, FP16Mixed

__all__ = ["POLICIES", "ALIASES", "get_policy", "policy_names"]

POLICIES: dict[str, type[Policy]] = {
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

ALIASES: dict[str, str] = {
    "32": "32-true",
    "fp32": "32-true",
    "float32": "32-true",
    "no": "32-true",
    "16": "16-mixed",
    "fp16": "16-mixed",
    "float16": "16-mixed",
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "fp8": "fp8-tensorwise",  # Accelerate's mixed_precision="fp8"
    # Apex opt levels (capital letter O, then a digit)
    "O0": "32-true",
    "O1": "16-mixed",
    "O2": "16-true-masters",
    "O3": "16-true",
}

_LOOKUP = {k.lower(): v for k, v in {**{n: n for n in POLICIES}, **ALIASES}.items()}


def policy_names() -> list[str]:
    """Canonical policy names, in the order tables list them.

    >>> policy_names()[:3]
    ['32-true', 'tf32', 'bf16-mixed']
    """
    return list(POLICIES)


def _suggest(name: str) -> str | None:
    # Apex users type the digit zero for the letter O ("01"); that is the commonest miss, so check it first.
    if len(name) == 2 and name[0] == "0" and name[1].isdigit() and f"O{name[1]}" in ALIASES:
        return f"O{name[1]}"
    close = difflib.get_close_matches(name.lower(), list(_LOOKUP), n=1, cutoff=0.5)
    if not close:
        return None
    canonical = next((k for k in [*POLICIES, *ALIASES] if k.lower() == close[0]), close[0])
    return canonical


def get_policy(precision: "str | int | Policy", keep_fp32: Iterable[str | type[nn.Module]] = ()) -> Policy:
    """Resolve a name, alias, int (16, 32) or Policy to a Policy, optionally keeping modules in fp32.

    >>> get_policy("O2").name
    '16-true-masters'
    >>> get_policy("01")
    Traceback (most recent call last):
    ...
    ampkit.errors.PolicyError: Unknown precision '01'. Did you mean 'O1'? Valid: 32-true, tf32, ...
    """
    keep = check_keep_fp32(keep_fp32)
    if isinstance(precision, Policy):
        return precision.with_keep_fp32(*keep) if keep else precision
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        raise PolicyError(f"precision must be a policy name such as 'bf16-mixed', got {type(precision).__name__} {precision!r}.")
    key = str(precision).strip()
    canonical = _LOOKUP.get(key.lower())
    if canonical is None:
        hint = _suggest(key)
        valid = ", ".join(POLICIES) + "; aliases: " + ", ".join(ALIASES)
        did_you_mean = f" Did you mean {hint!r}?" if hint else ""
        raise PolicyError(f"Unknown precision {precision!r}.{did_you_mean} Valid: {valid}.")
    return POLICIES[canonical](keep_fp32=keep)
