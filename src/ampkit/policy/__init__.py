"""Precision policies: one class per family, resolved by name through :mod:`ampkit.policy.registry`."""

from .base import Policy
from .device import Support
from .fp8 import FP8Rowwise, FP8Tensorwise
from .full import FullPrecision, TF32Precision
from .half import BF16True, BF16TrueMasters, BF16TrueRemainder, FP16True, FP16TrueMasters
from .lowbit import BF16TrueKahan, BF16TrueSR
from .mixed import BF16Mixed, FP16Mixed
from .registry import ALIASES, POLICIES, get_policy, policy_names

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
