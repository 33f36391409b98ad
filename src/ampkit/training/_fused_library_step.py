"""The library optimizer's step as one compiled region: torchao's stochastically rounded AdamW over every parameter.

``bf16-true-sr`` steps with torchao's ``_AdamW``, whose ``step`` compiles ``single_param_adam`` and calls it once per
parameter from a Python loop: per step, a compile wrapper built and its guards checked for each tensor, one
compiled call each (on a GPU, launches from 76 separate calls for a 76-tensor GPT; on the H200 that step made
``bf16-true-sr`` slower than fp32). Here the same update - torchao's code, through
:func:`ampkit.policy._lowbit_optimizers.region_step` - is traced once over all parameters, as the master-weight
step is in :mod:`ampkit.training._fused_master_step`, and from the same pieces:

- **Its own code object** (:func:`ampkit._compat.own_code`), so each engine's region has a compile cache of its own.
- **The first step unfused.** torchao builds its state (moments, step counts) in its first step; it runs eagerly
  (``torch.compiler.set_stance("force_eager")``), so torchao's per-shape compiles are not paid on top of the region's.
- **No recompilation when the learning rate changes.** torchao keeps each group's ``lr`` as a 0-d tensor, which
  schedulers fill in place: the region reads it as an input, as the master step reads the 0-d tensors it makes.

What differs from the master step: the region replaces only ``optimizer.step()``, so skipping, clipping and loss
scaling stay where they are (:mod:`ampkit.training._optimizer_step`), and a region that cannot be compiled (an
unsupported torch, a failed C++ or Triton build) warns once (as the master step's region does,
:mod:`ampkit.training._fused_step_compile`) and leaves the optimizer on its own step: a region ampkit chose to compile
never stops a run.

Random bits: inductor draws the stochastic rounding's bits inside the fused kernels (philox, seeded from torch's
generator), as in torchao's own compiled step; the engine seeds that generator from the run's rounding stream
around the step (:mod:`ampkit.training._rounding_stream`: the same on every replica, kept in checkpoints). On the CPU drawing them is most of the step: aten's ``randint`` over gpt small's weights alone takes 4x
the whole master-weight update (benchmarks/lowbit_step.py). Inductor's CPU philox is a scalar loop on every thread,
aten's generator vectorised but serial (``options={"fallback_random": True}`` picks it): on this project's 2-core
CPU, aten's was 1.6x faster on one thread and level on two, and only philox gains from more threads, so the default
is kept.

    >>> import ampkit
    >>> from torch import nn
    >>> from ampkit.policy._lowbit_optimizers import missing_library
    >>> def compiled_steps(steps: int) -> int:
    ...     model = nn.Linear(8, 8)
    ...     engine = ampkit.Engine("bf16-true-sr", fused_step={"backend": "aot_eager"})  # inductor by default
    ...     model, opt = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    ...     for _ in range(steps):
    ...         engine.backward(model(torch.randn(4, 8, dtype=torch.bfloat16)).float().square().mean()); _ = engine.step()
    ...     return engine.library_step.calls
    >>> compiled_steps(3) if missing_library("sr") is None else 2  # the first step builds torchao's state unfused
    2
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._compat import compiler_error, optimizer_has_step_hooks, own_code
from ..policy._lowbit_optimizers import region_step
from ._fused_step_compile import describe_failure, region_compile_kwargs, warn_fallback

__all__ = ["FusedLibraryStep", "build_library_step", "check_library_step", "library_step_problem", "uses_library_step"]

def uses_library_step(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Whether any of the optimizers has a library step to compile (torchao's ``_AdamW``, under ``bf16-true-sr``).

    >>> from torch import nn
    >>> uses_library_step([torch.optim.AdamW(nn.Linear(1, 1).parameters())])
    False
    """
    return any(region_step(opt) is not None for opt in optimizers)


def library_step_problem(optimizers: Sequence[torch.optim.Optimizer]) -> str | None:
    """Why the optimizers' library step cannot run as one compiled region, naming the fix; None when it can.

    >>> from torch import nn
    >>> print(library_step_problem([torch.optim.AdamW(nn.Linear(1, 1).parameters())]))
    only the master-weight policies ('bf16-true-masters', '16-true-masters') have a master step to fuse, and 'bf16-true-sr' a library step (bf16-true-kahan's optimi runs its own fused kernels); use fused_step=False
    """
    if not uses_library_step(optimizers):
        return ("only the master-weight policies ('bf16-true-masters', '16-true-masters') have a master step to fuse, and 'bf16-true-sr' "
                "a library step (bf16-true-kahan's optimi runs its own fused kernels); use fused_step=False")
    for opt in optimizers:
        if optimizer_has_step_hooks(opt):
            return f"{type(opt).__name__} has step hooks, which the compiled step would bypass; remove them or use fused_step=False"
    return None


def _maker(opt: torch.optim.Optimizer) -> str:
    return type(opt).__module__.split(".")[0]


def check_library_step(spec: bool | dict[str, Any] | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Refuse, before setup changes anything, a compiled library step that is insisted on and cannot run."""
    if spec is True or isinstance(spec, dict):
        problem = library_step_problem(optimizers)
        if problem is not None:
            raise ValueError(f"fused_step: {problem}.")


def build_library_step(
    spec: bool | dict[str, Any] | None, compile_options: dict[str, Any] | None, optimizers: Sequence[torch.optim.Optimizer]
) -> FusedLibraryStep | None:
    """The compiled library step ``Engine(fused_step=spec)`` asks for at setup, or None for the library's own step.

    ``spec=None`` turns it on wherever it can run - torchao compiles its step anyway, and one region costs one
    compile instead of one per parameter shape - with ``compile_options`` (``Engine(compile=...)``'s torch.compile
    options) when set. ``False`` keeps the library's step; ``True`` or a dict of torch.compile options insists
    (see :func:`check_library_step`).
    """
    if spec is False or library_step_problem(optimizers) is not None:
        return None
    options = spec if isinstance(spec, dict) else compile_options or {}
    return FusedLibraryStep(options)


class FusedLibraryStep:
    """Steps library optimizers (torchao's ``_AdamW``) through one compiled region each (see the module docstring).

    ``options`` go to ``torch.compile`` (default: inductor). :attr:`calls` counts the compiled steps taken;
    :attr:`failed` says why compiling failed, after which every step is the library's own.
    """

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.calls = 0
        self.failed: str | None = None
        self._updates: dict[int, Callable[[torch.optim.Optimizer], None] | None] = {}  # one per optimizer, kept:
        # the region guards on the function it is given, and a new one per step would recompile it every step
        # One graph (fullgraph=True, as the master step's region): a graph break would run part of the update and
        # then fail to compile the rest, leaving the step half taken.
        self._compiled: Callable[..., None] = torch.compile(own_code(_region), **region_compile_kwargs(self.options))

    def step(self, opt: torch.optim.Optimizer) -> None:
        """One step of ``opt``: through the region, or the library's own step where the region cannot run."""
        if id(opt) not in self._updates:
            self._updates[id(opt)] = region_step(opt)
        update = self._updates[id(opt)]
        if not opt.state:
            # The first step builds torchao's state, eagerly: its per-shape compiles would come on top of the region's.
            with torch.compiler.set_stance("force_eager"):
                opt.step()
            return
        # Hooks would be bypassed by the region; a float lr (a scheduler that assigned one) torchao itself refuses,
        # naming the fix. One check per group, not per tensor.
        if update is None or self.failed is not None or optimizer_has_step_hooks(opt) or not all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups):
            opt.step()
            return
        try:
            self._compiled(update, opt)
        except Exception as exc:
            if not compiler_error(exc):
                raise  # the compiled code's own failure (out of memory): the library's step would meet it too
            # Raised while tracing or compiling, before the region ran (one graph: all of it or nothing), so nothing
            # was updated: the library's own step takes this step and every later one. An error of the update's own
            # ops comes wrapped like a compiler error, and then the library's step raises it again, unwrapped.
            self.failed = describe_failure(exc)[:400]
            opt.step()
            warn_fallback(self.failed, region="ampkit's compiled optimizer step", instead=f"{_maker(opt)}'s own step")
            return
        self.calls += 1


def _region(update: Callable[[torch.optim.Optimizer], None], opt: torch.optim.Optimizer) -> None:
    """What torch.compile is given (a copy with its own code, see :func:`ampkit._compat.own_code`)."""
    with torch.no_grad():
        update(opt)
