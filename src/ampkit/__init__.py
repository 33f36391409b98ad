"""ampkit: fast, memory-lean and safe mixed-precision training on native PyTorch.

``import ampkit`` imports nothing but this file and :mod:`ampkit._errors`: every other public name is imported
the first time it is used (PEP 562), so ``ampkit --help`` runs without importing torch, and the library core
never drags in a tool (bench, memory, numerics, the CLI) or its dependencies (rich, matplotlib, scikit-learn).
``from ampkit import Engine`` and ``ampkit.Engine`` work as before; so does ``ampkit.<submodule>``.

    >>> import ampkit
    >>> ampkit.get_policy("bf16-mixed").name
    'bf16-mixed'
    >>> ampkit.recompute is ampkit.memory.recompute
    True

``ampkit.tune(model, data, ...)`` finds the fastest configuration that keeps fp32's accuracy (:mod:`ampkit.tuning`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from ._errors import AmpkitError, CheckpointError, LossScaleCollapseError, PolicyError, UnsupportedPolicyError

_moved.install()  # modules that moved into the layered layout stay importable by their old names

__version__ = "0.1.0"

# Where each lazily imported public name lives; the module is imported on the name's first use.
_LAZY: dict[str, str] = {
    "Engine": "ampkit.training._engine",
    "checkpoint_exists": "ampkit.checkpoint",
    "recompute": "ampkit.memory._recompute",
    "unrecompute": "ampkit.memory._recompute",
    "Policy": "ampkit.policy",
    "get_policy": "ampkit.policy",
    "policy_names": "ampkit.policy",
    "ScalerConfig": "ampkit.scaling",
    "LossScaler": "ampkit.scaling",
    "DynamicLossScaler": "ampkit.scaling",
    "StaticLossScaler": "ampkit.scaling",
    "tune": "ampkit.tuning",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the names as eager imports would give them
    from .checkpoint import checkpoint_exists
    from .memory._recompute import recompute, unrecompute
    from .policy import Policy, get_policy, policy_names
    from .scaling import DynamicLossScaler, LossScaler, ScalerConfig, StaticLossScaler
    from .training._engine import Engine
    from .tuning import tune

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
    "tune",
    "AmpkitError",
    "PolicyError",
    "UnsupportedPolicyError",
    "LossScaleCollapseError",
    "CheckpointError",
]


def __getattr__(name: str) -> Any:
    """A public name of :data:`_LAZY`, or a submodule (``ampkit.memory``), imported on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups find it without calling __getattr__ again
        return value
    if name.startswith("__"):  # probes such as __wrapped__ or __path__ of a submodule are no submodules
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        # Submodules were attributes after ``import ampkit`` when it imported them eagerly; they still are.
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the submodule exists but one of its own imports failed: that error is the useful one
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
