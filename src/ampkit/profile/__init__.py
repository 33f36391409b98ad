"""``ampkit profile``: where a training step's time goes, and which change would give it back.

So far: :class:`PhaseTimer`, the per-phase timing of each step at the engine's step hooks, and :class:`SyncFinder`,
the host syncs a loop makes and the lines that make them, and :func:`op_breakdown`, the casts' share and the
optimizer's op count read from torch.profiler.
"""

from .op_shares import OpBreakdown, PhaseRanges, op_breakdown
from .phases import PHASES, PhaseTimer, StepPhases
from .syncs import SyncFinder, SyncSite

__all__ = ["PHASES", "PhaseTimer", "StepPhases", "SyncFinder", "SyncSite", "PhaseRanges", "OpBreakdown", "op_breakdown"]
