"""Precision policies: one class per family, resolved by name through :mod:`ampkit.policy._registry`."""

from ._base import Policy
from ._device import Support
from ._fp8 import FP8Rowwise, FP8Tensorwise
from ._full import FullPrecision, TF32Precision
from ._half import BF16True, BF16TrueMasters, BF16TrueRemainder, FP16True, FP16TrueMasters
from ._lowbit import BF16TrueKahan, BF16TrueSR
from ._mixed import BF16Mixed, FP16Mixed
from ._registry import ALIASES, POLICIES, get_policy, policy_names

__all__ = [
    "Policy",
    "Support",
    "FullPrecision",
    "TF32Precision",
    "BF16Mixed",
    "FP16Mixed",
    "BF16True",
    "FP16True",
    "BF16TrueMasters",
    "BF16TrueRemainder",
    "BF16TrueKahan",
    "BF16TrueSR",
    "FP16TrueMasters",
    "FP8Tensorwise",
    "FP8Rowwise",
    "POLICIES",
    "ALIASES",
    "get_policy",
    "policy_names",
]
