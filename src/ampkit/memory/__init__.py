"""Memory of mixed-precision training: exact accounting, prediction without the device, and measurement.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit.memory import estimate
    >>> e = estimate(nn.Linear(1024, 1024), (torch.randn(32, 1024), torch.randint(0, 1024, (32,))), policy="bf16-mixed")
    >>> e.parameters, e.gradients
    (4198400, 4198400)
"""

from .._util.blocks import repeated_blocks
from ._accounting import LiveBytes, SavedActivations, tensor_bytes, training_state_bytes
from ._batch_finder import BatchSizeNotFoundError, find_max_batch_size
from ._estimate import BREAKDOWN, EstimateError, MemoryEstimate, estimate, measure
from ._fit import Fit, largest_batch, parse_bytes
from ._fp8_layers import Fp8Plan, fp8_layer_plan, planned_policy
from ._oom import MemoryBudget, is_out_of_memory, release_memory
from ._recompute import RecomputeReport, recompute, recomputed_modules, unrecompute
from ._tracker import MemorySample, MemorySummary, MemoryTracker

__all__ = [
    "BREAKDOWN", "BatchSizeNotFoundError", "EstimateError", "Fit", "Fp8Plan", "LiveBytes", "MemoryBudget", "MemoryEstimate", "MemorySample",
    "MemorySummary", "MemoryTracker", "SavedActivations",
    "RecomputeReport", "estimate", "find_max_batch_size", "fp8_layer_plan", "is_out_of_memory", "largest_batch", "measure", "parse_bytes", "planned_policy",
    "recompute", "recomputed_modules", "release_memory", "repeated_blocks", "tensor_bytes", "training_state_bytes", "unrecompute",
]
