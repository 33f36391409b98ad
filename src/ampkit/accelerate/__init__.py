"""ampkit inside Hugging Face Accelerate: :class:`AmpkitAccelerator` in place of ``Accelerator(mixed_precision=...)``.

    from ampkit.accelerate import AmpkitAccelerator
    accelerator = AmpkitAccelerator(precision="bf16-true-masters")    # was: Accelerator(mixed_precision="bf16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)   # the rest of the loop is unchanged

The loop keeps its ``accelerator.backward(loss)``, ``optimizer.step()``, ``scheduler.step()``,
``optimizer.zero_grad()`` and ``accelerator.accumulate(model)``; the engine (``accelerator.engine``, an
:class:`ampkit.Engine`) runs the policy, the loss scaler, the masters, the kernel guards and the skip decision, the
same on every DDP rank, and ``accelerator.save_state`` / ``load_state`` carry its state. The prepared model is the
user's model object, so the tools take it as it is (``ampkit.memory``, ``ampkit.numerics``, ``ampkit.tune``).
Importing this package checks the installed accelerate against the tested range; it imports accelerate itself on
first use of a name.

    >>> from ampkit.accelerate import AmpkitAccelerator
    >>> AmpkitAccelerator("bf16-mixed", cpu=True).precision
    'bf16-mixed'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._util.framework_versions import require
from .._util.lazy import lazy_names

require("accelerate", "ampkit.accelerate")

if TYPE_CHECKING:
    from ._accelerator import AmpkitAccelerator
    from ._optimizer import AmpkitOptimizer

# Where each public name lives (its module, relative to this package): imported on the name's first use.
_NAMES = {
    "AmpkitAccelerator": "_accelerator",
    "AmpkitOptimizer": "_optimizer",
}

__all__ = ["AmpkitAccelerator", "AmpkitOptimizer"]

__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
