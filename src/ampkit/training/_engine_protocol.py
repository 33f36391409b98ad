"""The engine as the code around it uses it: the members its helpers, step hooks and checkpoints read (and the few
they set), as a :class:`typing.Protocol`.

The :class:`~ampkit.training.Engine` calls code that takes the engine back: the checkpoint layer
(``engine.save``/``load``), the step hooks (the numerics sampler among them, which ``Engine(numerics=N)`` builds),
its state dict, its misuse checks and its OOM micro-batching. Typed against the ``Engine`` class, each of those
modules would import the module that imports them: one circle of modules, type checkers included. Typed against
this protocol they import nothing above the step state; the Engine meets it structurally (mypy checks it wherever
the engine passes itself), so nothing here is registered or inherited, and nothing of it runs.

:class:`EngineLike` is the read side (settings, parts, counters) plus the one assignable setting,
``micro_batch_rows``, and the step state a load restores: what checkpoints, step hooks and the misuse checks use.
:class:`EngineLoop` adds the three loop calls that :meth:`Engine.train_step <ampkit.training.Engine.train_step>`'s
micro-batching drives.

    >>> from ampkit import Engine
    >>> def window_left(engine: EngineLike) -> int:  # a helper that reads the engine without importing its class
    ...     return engine.accumulate - engine.micro_batches_pending
    >>> window_left(Engine(accumulate=4))
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # for type checkers only: at run time this module imports nothing of ampkit
    import torch
    from torch import nn

    from ..distributed._strategy import Strategy
    from ..policy import Policy
    from ..policy._masters import MasterWeights
    from ..scaling._protocol import StepScaler
    from ._step_state import StepState

__all__ = ["EngineLike", "EngineLoop", "StateOwner"]


class StateOwner(Protocol):
    """What a checkpoint needs of the optimizer step (:class:`~ampkit.training.OptimizerStep`): its state, out and in
    (the scaler's, the masters', the skipped count and the rounding stream, under the checkpoint's keys)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EngineLike(Protocol):
    """An engine as its checkpoints, step hooks and misuse checks read it (see the module docstring); each member is
    the :class:`~ampkit.training.EngineView` attribute of the same name. None of them syncs."""

    # The settings the engine was built with.
    @property
    def policy(self) -> Policy: ...
    @property
    def accumulate(self) -> int: ...
    @property
    def clip_grad_norm(self) -> float | None: ...
    @property
    def clip_grad_value(self) -> float | None: ...
    @property
    def skip_nonfinite(self) -> bool: ...

    # What setup() built, and who owns it.
    @property
    def strategy(self) -> Strategy | None: ...
    @property
    def models(self) -> Sequence[nn.Module]: ...
    @property
    def wrappers(self) -> Sequence[nn.Module]: ...
    @property
    def optimizers(self) -> Sequence[torch.optim.Optimizer]: ...
    @property
    def schedulers(self) -> Sequence[Any]: ...
    @property
    def scaler(self) -> StepScaler | None: ...
    @property
    def masters(self) -> MasterWeights | None: ...
    @property
    def optimizer_step(self) -> StateOwner: ...

    # Where the run stands.
    @property
    def step_state(self) -> StepState: ...
    @property
    def steps(self) -> int: ...
    @property
    def micro_batches_pending(self) -> int: ...
    @property
    def is_boundary(self) -> bool: ...

    micro_batch_rows: int | None
    """Assignable: a load puts back the rows the saved run learnt."""

    def named_parameters(self) -> Sequence[tuple[str, nn.Parameter]]: ...


class EngineLoop(EngineLike, Protocol):
    """:class:`EngineLike` plus the loop's calls, as :func:`~ampkit.training._micro_batching.train_step` makes them for
    each piece of a batch it splits."""

    def autocast(self) -> AbstractContextManager[Any]: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, *optimizers: torch.optim.Optimizer) -> bool: ...

