"""Memory of mixed-precision training: exact accounting, prediction without the device, and measurement.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.memory import estimate
    >>> e = estimate(nn.Linear(1024, 1024), (torch.randn(32, 1024), torch.randint(0, 1024, (32,))), policy="bf16-mixed")
    >>> e.parameters, e.gradients
    (4198400, 4198400)
"""

from .accounting import LiveBytes, SavedActivations, tensor_bytes, training_state_bytes
from .estimate import BREAKDOWN, MemoryEstimate, estimate, measure

__all__ = ["BREAKDOWN", "LiveBytes", "MemoryEstimate", "SavedActivations", "estimate", "measure", "tensor_bytes", "training_state_bytes"]
