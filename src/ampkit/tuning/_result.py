"""What a tune found: every trial, every pruned or untried candidate with its reason, the guard, the winner.

``tune.json`` is :meth:`TuneResult.to_dict` with the ranked table's rows (:func:`ampkit.tuning.rows`) and the winner's
code (:func:`ampkit.tuning.code`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._guard import GuardResult, Reference
from ._space import Candidate
from ._trials import Trial

__all__ = ["TuneResult"]


@dataclass
class TuneResult:
    """The outcome of :func:`ampkit.tuning.tune` (or ``ampkit tune``)."""

    workload: str
    description: str
    device: dict[str, Any]
    unit: str
    items_per_step: int
    """Samples (or tokens) of one optimizer step: the global batch, the same for every configuration."""
    run_steps: int
    """The run length compile time is amortised over."""
    budget_s: float
    start: Candidate
    """The user's starting point: fp32, their batch."""
    baseline: Candidate
    """What speed-ups are measured against: the start, or, when it does not fit, the largest micro-batch that does."""
    winner: Candidate
    winner_reason: str = ""
    trials: list[Trial] = field(default_factory=list)
    pruned: list[dict[str, Any]] = field(default_factory=list)
    """Candidates ruled out before running: stage, key, change (what differs from the start), reason."""
    not_tried: list[dict[str, Any]] = field(default_factory=list)
    """Candidates the budget left no time for."""
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Per stage: the configuration it varied, the one it chose, and why."""
    reference: Reference | None = None
    guard: dict[str, GuardResult] = field(default_factory=dict)
    """Accuracy-guard results by the configuration's numerics key."""
    loader_trials: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each part: ``facts``, ``probe``, each stage by name, ``finalists`` (the confirmation wave and
    the accuracy guard's runs not run before), in the order they ran."""
    interrupted: bool = False
    resumed: int = 0
    """Candidates whose trials were read back from an earlier, interrupted tune with the same ``--out``."""
    command: str = ""
    date: str = ""
    torch: str = ""
    ampkit: str = ""
    framework: str | None = None
    """The framework the model came from (``Workload.extra["framework"]``: ``"lightning"``, ``"transformers"``): the
    winner's code is printed in its terms (:mod:`ampkit._report.dialect`); None: plain PyTorch, as ``ampkit.Engine``."""
    supports_gradient_checkpointing: bool | None = None
    """A Hugging Face model's own gradient checkpointing (``Workload.extra``): recompute is printed as
    ``TrainingArguments(activation_checkpointing=True)`` where it has it; None: not known."""
    machine: dict[str, Any] = field(default_factory=dict)
    """How busy the machine was: its cores, the CPU time other processes took while the start was probed, the
    probe's step and spread (:class:`ampkit.tuning._run.Probe`)."""
    waves: list[dict[str, Any]] = field(default_factory=list)
    """Per wave as it ran: its stage, seconds, the cores other processes took meanwhile, its rounds, the rounds
    dropped because the control drifted, and whether it stayed disturbed (not judged)."""

    def guard_of(self, candidate: Candidate) -> GuardResult | None:
        return self.guard.get(candidate.numerics_key)

    def to_dict(self) -> dict[str, Any]:
        """The measurements as JSON-ready data (``tune.json`` adds the ranked rows and the winner's code to it:
        :func:`ampkit.tuning.write_files`)."""
        return {
            "workload": self.workload, "description": self.description, "device": self.device, "unit": self.unit,
            "items_per_step": self.items_per_step, "run_steps": self.run_steps, "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s, "timings": self.timings, "interrupted": self.interrupted, "resumed": self.resumed,
            "start": self.start.to_dict(), "baseline": self.baseline.to_dict(), "winner": self.winner.to_dict(),
            "winner_reason": self.winner_reason,
            "trials": [t.to_dict() for t in self.trials], "pruned": self.pruned, "not_tried": self.not_tried,
            "stages": self.stages, "reference": self.reference.to_dict() if self.reference else None,
            "guard": {k: g.to_dict() for k, g in self.guard.items()}, "loader_trials": self.loader_trials,
            "facts": self.facts, "notes": self.notes, "machine": self.machine, "waves": self.waves, "settings": self.settings, "command": self.command, "date": self.date,
            "torch": self.torch, "ampkit": self.ampkit, "framework": self.framework,
            "supports_gradient_checkpointing": self.supports_gradient_checkpointing,
        }
