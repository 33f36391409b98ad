"""Loss scalers: dynamic (hysteresis, floor, ceiling, collapse diagnosis) and static, on fused kernels."""

from .base import LossScaler
from .config import ScalerConfig
from .dynamic import DynamicLossScaler
from .static import StaticLossScaler

__all__ = ["LossScaler", "ScalerConfig", "DynamicLossScaler", "StaticLossScaler"]
