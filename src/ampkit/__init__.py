"""ampkit: fast, memory-lean and safe mixed-precision training on native PyTorch."""

__version__ = "0.1.0"

from .errors import AmpkitError, CheckpointError, LossScaleCollapseError, PolicyError, UnsupportedPolicyError
from .policy import Policy, get_policy, policy_names

__all__ = [
    "__version__",
    "Policy",
    "get_policy",
    "policy_names",
    "AmpkitError",
    "PolicyError",
    "UnsupportedPolicyError",
    "LossScaleCollapseError",
    "CheckpointError",
]
