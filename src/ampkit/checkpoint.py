"""Exact save/resume of a training run driven by an :class:`~ampkit.engine.Engine`.

A checkpoint holds the models, optimizers, schedulers, the engine's counters, the loss scaler, the fp32
master weights (Apex lost them, so O2 resumes spiked), gradients pending in an unfinished accumulation
window, and every RNG. Loading validates the whole file against the running setup before changing anything,
so a bad or mismatched checkpoint leaves the run exactly as it was.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from .errors import CheckpointError
from .state import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint

if TYPE_CHECKING:
    from .engine import Engine

__all__ = [
    "engine_state",
    "load_engine_state",
    "training_payload",
    "check_training_payload",
    "apply_training_payload",
    "save_training_state",
    "load_training_state",
]

_SAFE_LEAVES = (torch.Tensor, str, int, float, bool, type(None))


def _pending_grads(engine: "Engine") -> dict[str, torch.Tensor] | None:
    if engine._micro % engine.accumulate == 0:
        return None
    return {
        engine._param_names[id(p)]: p.grad.detach().clone()
        for m in engine.models
        for p in m.parameters()
        if p.grad is not None and id(p) in engine._param_names
    }


def engine_state(engine: "Engine") -> dict[str, Any]:
    """The engine's own state (no model or optimizer tensors besides masters and pending gradients)."""
    return {
        "policy": engine.policy.name,
        "accumulate": engine.accumulate,
        "micro": engine._micro,
        "epoch_len": engine._epoch_len,
        "steps": engine.steps,
        "micro_batch_rows": engine.micro_batch_rows,
        "skipped_steps": engine.skipped_steps,
        "scaler": engine.scaler.state_dict() if engine.scaler is not None else None,
        "masters": engine.masters.state_dict() if engine.masters is not None else None,
        "pending_grads": _pending_grads(engine),
    }


def _check_engine_state(engine: "Engine", state: dict[str, Any]) -> None:
    if state.get("policy") != engine.policy.name:
        raise CheckpointError(
            f"The checkpoint was written under policy {state.get('policy')!r}, but this engine runs {engine.policy.name!r}. "
            f"Resume with Engine(precision={state.get('policy')!r}); switching policy mid-run breaks exact resume."
        )
    if (state["scaler"] is None) != (engine.scaler is None):
        raise CheckpointError("The checkpoint's loss-scaler setting differs from this engine's; pass the same scaler= as the saved run.")
    if state["pending_grads"] is not None and state["accumulate"] != engine.accumulate:
        raise CheckpointError(
            f"The checkpoint stopped inside an accumulation window of {state['accumulate']}; resume with accumulate={state['accumulate']}."
        )
    if (state["masters"] is None) != (engine.masters is None):
        raise CheckpointError("The checkpoint's master weights do not match this engine's policy setup.")
    if engine.masters is not None and set(state["masters"]) != set(engine.masters.names):
        raise CheckpointError("The checkpoint's master weights name other parameters than this model has; is it the same model?")


def load_engine_state(engine: "Engine", state: dict[str, Any]) -> None:
    """Restore :func:`engine_state` after validating it against ``engine``."""
    _check_engine_state(engine, state)
    engine._micro, engine._epoch_len, engine.steps = state["micro"], state["epoch_len"], state["steps"]
    if state.get("micro_batch_rows") is not None:  # learnt after an OOM; absent from older checkpoints
        engine.micro_batch_rows = state["micro_batch_rows"]
    engine._skipped_total.fill_(int(state["skipped_steps"]))  # type: ignore[union-attr]
    engine._last_found_host = engine._last_norm = engine._deferred = None
    engine._diagnose_late = False
    if engine.scaler is not None:
        engine.scaler.load_state_dict(state["scaler"])
    if engine.masters is not None:
        engine.masters.load_state_dict(state["masters"])
    if state["pending_grads"] is not None:
        by_name = {engine._param_names[id(p)]: p for m in engine.models for p in m.parameters() if id(p) in engine._param_names}
        for name, grad in state["pending_grads"].items():
            p = by_name[name]
            p.grad = grad.to(device=p.device, dtype=p.dtype)


def _check_safe(value: Any, where: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _check_safe(k, where)
            _check_safe(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_safe(v, f"{where}[{i}]")
    elif not isinstance(value, _SAFE_LEAVES):
        # Name functions as such: "builtin_function_or_method" tells a user less than "a function".
        what = f"a function ({getattr(value, '__name__', '?')})" if callable(value) and not isinstance(value, type) else f"a {type(value).__name__}"
        raise CheckpointError(
            f"{where} holds {what}, which a safe (weights_only) load refuses; "
            "store only tensors, numbers, strings and lists/dicts of them."
        )


def training_payload(engine: "Engine", extra: dict[str, Any] | None, *, tensors: bool = True) -> dict[str, Any]:
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


def save_training_state(engine: "Engine", path: str | os.PathLike, extra: dict[str, Any] | None = None) -> None:
    """Write everything needed to resume ``engine``'s run bitwise-exactly, atomically, to ``path``.

    Under a distributed strategy every rank must call it: see :mod:`ampkit.distributed.checkpoint`.
    """
    if engine.strategy is not None:
        from .distributed.checkpoint import save_distributed

        save_distributed(engine, path, extra)
        return
    save_checkpoint(training_payload(engine, extra), path)


def _check_model(i: int, model: torch.nn.Module, saved: dict[str, torch.Tensor], path: Any) -> None:
    current = model.state_dict()
    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    wrong = [k for k in current if k in saved and tuple(saved[k].shape) != tuple(current[k].shape)]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"{path}: model {i} does not match the checkpoint (missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"shape mismatch {wrong[:3]}). Build the same model as the saved run before engine.load()."
        )


def check_training_payload(engine: "Engine", payload: Any, path: Any) -> None:
    """Validate a checkpoint's payload against the running setup; raise CheckpointError naming the fix."""
    expected = {"engine", "models", "optimizers", "schedulers", "rng", "extra"}
    if not isinstance(payload, dict) or not expected <= set(payload):
        raise CheckpointError(f"{path} is an ampkit file but not a training checkpoint written by Engine.save().")
    try:
        _check_engine_state(engine, payload["engine"])
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    what_mine = [("schedulers", engine.schedulers)]
    if payload["models"] is not None:
        what_mine += [("models", engine.models), ("optimizers", engine.optimizers)]
    for what, mine in what_mine:
        if len(payload[what]) != len(mine):
            raise CheckpointError(f"{path} holds {len(payload[what])} {what}, this run has {len(mine)}; set up the same ones.")
    if payload["models"] is None:
        return
    for i, (model, saved) in enumerate(zip(engine.models, payload["models"])):
        _check_model(i, model, saved, path)
    for opt, saved in zip(engine.optimizers, payload["optimizers"]):
        if [len(g["params"]) for g in saved["param_groups"]] != [len(g["params"]) for g in opt.param_groups]:
            raise CheckpointError(f"{path}: an optimizer's parameter groups differ from the checkpoint's; build it as the saved run did.")


def apply_training_payload(engine: "Engine", payload: dict[str, Any]) -> None:
    """Restore a validated payload (models and optimizers only when it holds them)."""
    if payload["models"] is not None:
        for model, saved in zip(engine.models, payload["models"]):
            model.load_state_dict(saved)
        for opt, saved in zip(engine.optimizers, payload["optimizers"]):
            opt.load_state_dict(saved)
    for sched, saved in zip(engine.schedulers, payload["schedulers"]):
        sched.load_state_dict(saved)
    load_engine_state(engine, payload["engine"])
    if payload["rng"] is not None:
        restore_rng_state(payload["rng"])


def load_training_state(engine: "Engine", path: str | os.PathLike) -> dict[str, Any] | None:
    """Restore what :func:`save_training_state` wrote. Validates everything first; on error nothing changes.

    A checkpoint written by a distributed run (a DDP file, an FSDP directory) loads here too, on any world
    size torch can reshard to; see :mod:`ampkit.distributed.checkpoint`.
    """
    if not engine.models:
        raise RuntimeError("engine.load() called before engine.setup(); set up the same model and optimizers first.")
    if engine.strategy is not None or os.path.isdir(path):
        from .distributed.checkpoint import load_distributed

        return load_distributed(engine, path)
    payload = load_checkpoint(path, map_location="cpu")
    check_training_payload(engine, payload, path)
    ranks = payload.get("ranks")
    if ranks is not None and ranks["world_size"] > 1 and payload["engine"]["pending_grads"] is not None:
        raise CheckpointError(
            f"{path} was saved by {ranks['world_size']} ranks inside an accumulation window, with gradients pending on each; "
            "resume it on the same number of ranks, or save at an accumulation boundary (engine.is_boundary)."
        )
    apply_training_payload(engine, payload)
    return payload["extra"]
