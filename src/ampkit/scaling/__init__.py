"""Loss scalers: dynamic (hysteresis, floor, ceiling, collapse diagnosis) and static, on fused kernels; what the\noptimizer step needs of any scaler (:class:`StepScaler`)."""

from .base import LossScaler
from .config import ScalerConfig
from .dynamic import DynamicLossScaler
from .protocol import StepScaler
from .static import StaticLossScaler

__all__ = ["DynamicLossScaler", "LossScaler", "ScalerConfig", "StaticLossScaler", "StepScaler"]
