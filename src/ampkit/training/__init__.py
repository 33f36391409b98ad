"""The training layer: the engine and what one optimizer step is made of.

It sits on policy, scaling and the distributed strategies, and below checkpoints and every tool. Its public names:
the :class:`Engine` (the loop API, also ``ampkit.Engine``) and what it lets users read (:class:`EngineView`), the
optimizer step component it delegates to (:class:`OptimizerStep`, built from :class:`StepSettings`, returning a
:class:`StepOutcome` each step), the run's counters (:class:`StepState`), the step-hook protocol (:class:`StepHook`,
:class:`Hooks`, :data:`HookPoint`), what ``compile=`` asks for (:class:`CompilePlan`), the gradient clipping the step
applies (:func:`clip_grad_norm`, :func:`clip_grad_value`) and the torch kernel defects it guards against
(:class:`KernelDefect`, :data:`KNOWN_DEFECTS`), and saving on preemption (``Engine.save_on_preemption`` returns a
:class:`PreemptionWatch`; :class:`Preempted` exits with :data:`REQUEUE_EXIT_CODE`). The modules behind them are internal (``_engine.py``, ...).
Importing this package imports none of them: each name loads on first use.

    >>> from ampkit.training import Engine, StepOutcome
    >>> Engine("bf16-mixed").policy.name
    'bf16-mixed'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._util.lazy import lazy_names

if TYPE_CHECKING:
    from ._clipping import clip_grad_norm, clip_grad_value
    from ._compile import CompilePlan
    from ._engine import Engine
    from ._engine_view import EngineView
    from ._hooks import HookPoint, Hooks, StepHook
    from ._kernel_guards import KNOWN_DEFECTS, KernelDefect
    from ._optimizer_step import OptimizerStep
    from ._preemption import REQUEUE_EXIT_CODE, Preempted, PreemptionWatch
    from ._step_records import StepOutcome, StepSettings
    from ._step_state import StepState

# Where each public name lives (its module, relative to this package): imported on the name's first use.
_NAMES = {
    "Engine": "_engine",
    "EngineView": "_engine_view",
    "OptimizerStep": "_optimizer_step",
    "StepOutcome": "_step_records",
    "StepSettings": "_step_records",
    "StepState": "_step_state",
    "StepHook": "_hooks",
    "Hooks": "_hooks",
    "HookPoint": "_hooks",
    "CompilePlan": "_compile",
    "clip_grad_norm": "_clipping",
    "clip_grad_value": "_clipping",
    "KernelDefect": "_kernel_guards",
    "KNOWN_DEFECTS": "_kernel_guards",
    "Preempted": "_preemption",
    "PreemptionWatch": "_preemption",
    "REQUEUE_EXIT_CODE": "_preemption",
}

__all__ = [
    "Engine",
    "EngineView",
    "OptimizerStep",
    "StepOutcome",
    "StepSettings",
    "StepState",
    "StepHook",
    "Hooks",
    "HookPoint",
    "CompilePlan",
    "clip_grad_norm",
    "clip_grad_value",
    "KernelDefect",
    "KNOWN_DEFECTS",
    "Preempted",
    "PreemptionWatch",
    "REQUEUE_EXIT_CODE",
]

__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
