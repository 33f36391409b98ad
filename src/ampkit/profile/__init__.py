"""``ampkit profile``: where a training step's time goes, and which change would give it back.

So far: :class:`PhaseTimer`, the per-phase timing of each step at the engine's step hooks.
"""

from .phases import PHASES, PhaseTimer, StepPhases

__all__ = ["PHASES", "PhaseTimer", "StepPhases"]
