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
import logging
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
    "lr_differs",
    "note_schedulers",
    "load_engine_state",
    "pending_grads",
    "training_payload",
]

# Exactly these classes: a subclass of one (numpy's float64, an IntEnum, torch's version string, a namedtuple, a
# defaultdict) pickles as itself, which a safe load refuses, so a file saved with it could never be resumed from.
log = logging.getLogger("ampkit")

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
        note_schedulers(engine)
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
    notes = []
    if payload["models"] is not None:
        for i, (opt, saved) in enumerate(zip(engine.optimizers, payload["optimizers"])):
            notes += lr_differs(i, opt, saved)
            opt.load_state_dict(saved)
            guard_optimizer(opt)  # the saved groups' fused flags come from another machine or torch
        for model, saved in zip(engine.models, payload["models"]):
            model.load_state_dict(saved)
    for sched, saved in zip(engine.schedulers, payload["schedulers"]):
        sched.load_state_dict(saved)
    note_schedulers(engine)
    apply_engine_state(engine, payload["engine"])
    if payload["rng"] is not None:
        restore_rng_state(payload["rng"])
    for note in notes:  # once nothing can fail: a load that is undone changed no learning rate
        log.warning("%s", note)


def lr_differs(i: int, opt: torch.optim.Optimizer, saved: dict[str, Any]) -> list[str]:
    """What a load does to the learning rate optimizer ``i`` was built with, where the checkpoint's differs: the
    checkpoint's wins (a resume continues the saved run), which a user who changed it on purpose must learn. The
    rate compared is the one the run was built with, ``initial_lr`` where an LR scheduler set it (the scheduled rate
    at the save differs from a fresh run's on every resume, and is meant to be restored).

    >>> w = torch.nn.Parameter(torch.zeros(2)); saved = torch.optim.SGD([w], lr=0.1).state_dict()
    >>> lr_differs(0, torch.optim.SGD([w], lr=0.1), saved)
    []
    >>> print(lr_differs(0, torch.optim.SGD([w], lr=0.01), saved)[0])  # doctest: +ELLIPSIS
    engine.load(): optimizer 0 (SGD) was built with lr=0.01, the checkpoint holds lr=0.1: the checkpoint's wins, ...
    """
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return []  # validated elsewhere (a sharded load's groups are checked by torch)
    built = [g.get("initial_lr", g.get("lr")) for g in opt.param_groups]
    kept = [g.get("initial_lr", g.get("lr")) for g in groups]
    if not all(isinstance(v, (int, float)) for v in built + kept) or built == kept:
        return []  # a tensor lr is not read (that could sync); equal rates need no word
    mine, theirs = (f"{v[0]:g}" if len(set(v)) == 1 else str(v) for v in (built, kept))
    return [(
        f"engine.load(): optimizer {i} ({type(opt).__name__}) was built with lr={mine}, the checkpoint holds lr={theirs}: the "
        "checkpoint's wins, as a resume continues the saved run (its LR schedulers too). To train on with the new rate, set "
        f"it after engine.load(): for g in optimizer.param_groups: g['lr'] = {mine} (and g['initial_lr'] and the scheduler's "
        "base_lrs where a scheduler runs)."
    )]


def note_schedulers(engine: EngineLike) -> None:
    """Tell the optimizer step where a load left the schedulers, so that it does not take their new position for a
    ``scheduler.step()`` of the user's own (see :mod:`~ampkit.training._schedule_watch`)."""
    watch = getattr(engine.optimizer_step, "schedule_watch", None)  # the OptimizerStep's; a checkpoint protocol has none
    if watch is not None:
        watch.note(engine.schedulers)
