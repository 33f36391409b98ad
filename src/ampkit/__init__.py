"""ampkit: fast, memory-lean and safe mixed-precision training on native PyTorch."""

__version__ = "0.1.0"

from .checkpoint import checkpoint_exists
from .errors import AmpkitError, CheckpointError, LossScaleCollapseError, PolicyError, UnsupportedPolicyError
from .engine import Engine
from .memory.recompute import recompute, unrecompute
from .policy import Policy, get_policy, policy_names
from .scaling import DynamicLossScaler, LossScaler, ScalerConfig, StaticLossScaler

__all__ = [
    "__version__",
    "Engine",
    "checkpoint_exists",
    "recompute",
    "unrecompute",
    "Policy",
    "ScalerConfig",
    "LossScaler",
    "DynamicLossScaler",
    "StaticLossScaler",
    "get_policy",
    "policy_names",
    "AmpkitError",
    "PolicyError",
    "UnsupportedPolicyError",
    "LossScaleCollapseError",
    "CheckpointError",
]
