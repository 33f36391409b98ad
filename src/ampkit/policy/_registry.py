"""The one place policy names and their aliases are resolved.

Canonical names follow the ecosystem (Lightning's ``32-true``, ``bf16-mixed``, ...); aliases cover what users
type elsewhere: Accelerate's ``no``/``fp16``/``bf16``, bare dtypes, and Apex's opt levels ``O0``-``O3``. The names
and aliases themselves are text in :mod:`ampkit.policy_names`, which the command line reads without torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from .._errors import PolicyError
from .._util.policy_names import ALIASES, canonical_name, unknown_precision
from ._base import Policy
from ._fp8 import FP8Rowwise, FP8Tensorwise
from ._full import FullPrecision, TF32Precision
from ._half import (
    BF16True,
    BF16TrueMasters,
    BF16TrueRemainder,
    FP16True,
    FP16TrueMasters,
)
from ._islands import check_keep_fp32
from ._lowbit import BF16TrueKahan, BF16TrueSR
from ._mixed import BF16Mixed, FP16Mixed

__all__ = ["ALIASES", "POLICIES", "get_policy", "policy_names"]

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
"""Each policy's class by its canonical name (:data:`~ampkit.policy_names.POLICY_NAMES`, in that order)."""


def policy_names() -> list[str]:
    """Canonical policy names, in the order tables list them.

    >>> policy_names()[:3]
    ['32-true', 'tf32', 'bf16-mixed']
    """
    return list(POLICIES)


def get_policy(precision: str | int | Policy, keep_fp32: Iterable[str | type[nn.Module]] = ()) -> Policy:
    """Resolve a name, alias, int (16, 32) or Policy to a Policy, optionally keeping modules in fp32.

    >>> get_policy("O2").name
    '16-true-masters'
    >>> get_policy("01")
    Traceback (most recent call last):
    ...
    ampkit.PolicyError: Unknown precision '01'. Did you mean 'O1'? Valid: 32-true, tf32, ...
    """
    keep = check_keep_fp32(keep_fp32)
    if isinstance(precision, Policy):
        return precision.with_keep_fp32(*keep) if keep else precision
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        raise PolicyError(f"precision must be a policy name such as 'bf16-mixed', got {type(precision).__name__} {precision!r}.")
    canonical = canonical_name(str(precision))
    if canonical is None:
        raise PolicyError(unknown_precision(precision))
    return POLICIES[canonical](name=canonical, keep_fp32=keep)
