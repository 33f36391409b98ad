"""What a checkpoint of an :class:`~ampkit.training.Engine` run holds, and how it is taken and put back.

One payload for every writer: :mod:`ampkit.checkpoint` writes it to a single file, :mod:`ampkit.checkpoint._sharded`
beside the shards of a sharded directory. The payload holds the engine's counters, the loss scaler, the fp32 master
weights, gradients pending in an unfinished accumulation window, schedulers, every RNG and (unless a sharded
writer saves them itself) the models and optimizers.

Putting it back happens under an :class:`Undo` that holds what the load overwrites, so anything that fails
part-way (a custom module's load hook, an optimizer's ``__setstate__``, a Ctrl-C) puts every model, optimizer,
scheduler, counter, gradient and generator back as it was before the error is raised.
"""

from __future__ import annotations

import collections
import copy
import numbers
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from .._errors import CheckpointError, one_line
from ..fileio._checkpoint_files import capture_rng_state, restore_rng_state
from ..training._engine_state import apply_engine_state, engine_state, pending_grads
from ..training._kernel_guards import guard_optimizer
from ._checks import check_engine_state

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

    from ..training._engine_protocol import EngineLike

__all__ = [
    "Undo",
    "apply_payload",
    "apply_training_payload",
    "engine_state",
    "load_engine_state",
    "pending_grads",
    "training_payload",
]

# Exactly these classes: a subclass of one (numpy's float64, an IntEnum, torch's version string, a namedtuple, a
# defaultdict) pickles as itself, which a safe load refuses, so a file saved with it could never be resumed from.
_SAFE_LEAVES = (str, int, float, bool, type(None))
_SAFE_MAPPINGS = (dict, collections.OrderedDict)
_SAFE_SEQUENCES = (list, tuple, torch.Size)


def load_engine_state(engine: EngineLike, state: dict[str, Any]) -> None:
    """Restore :func:`engine_state` after validating it against ``engine``; on any error nothing changes."""
    check_engine_state(engine, state)
    with Undo(engine, models=False):
        apply_engine_state(engine, state)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard (DTensor): its own part


class Undo:
    """Holds what a load overwrites; leaving the block by an exception puts all of it back, then re-raises.

    Optimizers and gradients are restored by reference (a load replaces their containers, it does not write
    into them); model tensors, which a load writes in place, by a copy on the host (the checkpoint being
    loaded is already there, so the host has room for one more model); the rest by its own state_dict.
    """

    def __init__(self, engine: EngineLike, *, models: bool = True) -> None:
        self.engine = engine
        self.tensors = [(t, _local(t).detach().to("cpu", copy=True)) for m in engine.models for t in _model_tensors(m)] if models else []
        self.grads = [(p, p.grad) for p in _engine_params(engine)]
        self.optimizers = [(o, o.state, list(o.param_groups), dict(o.state)) for o in engine.optimizers]
        self.schedulers = [copy.deepcopy(s.state_dict()) for s in engine.schedulers]
        self.counters = engine_state(engine)
        self.micro_batch_rows, self.step_state = engine.micro_batch_rows, copy.copy(engine.step_state)
        self.rng = capture_rng_state()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            return
        self.restore()
        if isinstance(exc, CheckpointError) or not isinstance(exc, Exception):
            return  # re-raised as it is: already clear, or a KeyboardInterrupt/SystemExit
        raise CheckpointError(f"loading the checkpoint failed part-way ({one_line(exc, with_type=True)}); everything it had changed was restored.") from exc

    def restore(self) -> None:
        """Put back everything as it was when the snapshot was taken."""
        engine = self.engine
        for opt, state, groups, entries in self.optimizers:
            state.clear()
            state.update(entries)  # the state a sharded load's initialisation may have filled in place
            opt.__dict__.update(state=state, param_groups=groups)
        for sched, saved in zip(engine.schedulers, self.schedulers):
            sched.load_state_dict(saved)
        apply_engine_state(engine, self.counters)
        for p, grad in self.grads:
            p.grad = grad
        engine.micro_batch_rows = self.micro_batch_rows
        engine.step_state.restore(self.step_state)  # the last step's outcome too, which a load forgets
        with torch.no_grad():  # last: restoring master weights above wrote their 16-bit copies into the model
            for t, saved in self.tensors:
                _local(t).copy_(saved)
        restore_rng_state(self.rng)


def _model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers() if t is not None]


def _engine_params(engine: EngineLike) -> list[torch.Tensor]:
    params: list[torch.Tensor] = [p for m in engine.models for p in m.parameters()]
    return params + (list(engine.masters.masters) if engine.masters is not None else [])


def _check_safe(value: Any, where: str) -> None:
    """Refuse at save what ``torch.load(weights_only=True)`` would refuse at load, naming the plain value to store."""
    kind = type(value)
    if kind in _SAFE_MAPPINGS:
        for k, v in value.items():
            _check_safe(k, where)
            _check_safe(v, f"{where}[{k!r}]")
    elif kind in _SAFE_SEQUENCES:
        for i, v in enumerate(value):
            _check_safe(v, f"{where}[{i}]")
    elif kind not in _SAFE_LEAVES and not isinstance(value, torch.Tensor):
        # The plain class it stands for (numpy's int64 is no int subclass, but an Integral all the same).
        plain = next((t for t, abc in _PLAIN if isinstance(value, abc)), None)
        if plain is not None:
            raise CheckpointError(
                f"{where} holds a {kind.__name__}, a {plain.__name__} of another class, which a safe (weights_only) load "
                f"refuses; store {plain.__name__}(value)."
            )
        # Name functions as such: "builtin_function_or_method" tells a user less than "a function".
        what = f"a function ({getattr(value, '__name__', '?')})" if callable(value) and not isinstance(value, type) else f"a {kind.__name__}"
        raise CheckpointError(
            f"{where} holds {what}, which a safe (weights_only) load refuses; "
            "store only tensors, numbers, strings and lists/dicts of them."
        )


_PLAIN: tuple[tuple[type, type], ...] = (
    (bool, bool), (int, numbers.Integral), (float, numbers.Real), (str, str), (tuple, tuple), (list, list), (dict, dict),
)


def training_payload(engine: EngineLike, extra: dict[str, Any] | None, *, tensors: bool = True) -> dict[str, Any]:
    """What a checkpoint holds; ``tensors=False`` leaves out models and optimizers (a sharded save writes those)."""
    if not engine.models:
        raise RuntimeError("engine.save() called before engine.setup(); there is nothing to save yet.")
    _check_safe(extra, "extra")
    return {
        "engine": engine_state(engine),
        "models": [m.state_dict() for m in engine.models] if tensors else None,
        "optimizers": [o.state_dict() for o in engine.optimizers] if tensors else None,
        "schedulers": [s.state_dict() for s in engine.schedulers],
        "rng": capture_rng_state(),
        "extra": extra,
    }


def apply_training_payload(engine: EngineLike, payload: dict[str, Any]) -> None:
    """Restore a validated payload (models and optimizers only when it holds them); all or nothing."""
    with Undo(engine):
        apply_payload(engine, payload)


def apply_payload(engine: EngineLike, payload: dict[str, Any]) -> None:
    """Restore a validated payload without an :class:`Undo` of its own: for a caller that holds one around more."""
    if payload["models"] is not None:
        for opt, saved in zip(engine.optimizers, payload["optimizers"]):
            opt.load_state_dict(saved)
            guard_optimizer(opt)  # the saved groups' fused flags come from another machine or torch
        for model, saved in zip(engine.models, payload["models"]):
            model.load_state_dict(saved)
    for sched, saved in zip(engine.schedulers, payload["schedulers"]):
        sched.load_state_dict(saved)
    apply_engine_state(engine, payload["engine"])
    if payload["rng"] is not None:
        restore_rng_state(payload["rng"])
