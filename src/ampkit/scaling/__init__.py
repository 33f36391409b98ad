"""Loss scalers: dynamic (hysteresis, floor, ceiling, collapse diagnosis) and static, on fused kernels; what the\noptimizer step needs of any scaler (:class:`StepScaler`)."""

from ._base import LossScaler
from ._config import ScalerConfig
from ._dynamic import DynamicLossScaler
from ._protocol import StepScaler
from ._static import StaticLossScaler

__all__ = ["DynamicLossScaler", "LossScaler", "ScalerConfig", "StaticLossScaler", "StepScaler"]
