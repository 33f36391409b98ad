"""Everything a checkpoint load checks before it changes anything.

``engine.load()`` promises that a checkpoint which does not fit the running setup changes nothing. A check of
names alone is not enough: a scaler of another kind, an optimizer of another class, a scheduler entry of the
wrong type or an optimizer moment of the wrong shape all load "successfully" into torch's objects and fail
later, half applied, or not at all. So every part of a payload is compared with what the running setup itself
would save: same keys, same kinds of values, same tensor shapes. The first difference raises one
:class:`~ampkit.CheckpointError` that says where it is and what to do.

    >>> conforms({"lr": 0.1, "steps": [1, 2]}, {"lr": 0.5, "steps": [0, 0]}, "sched")
    >>> conforms({"lr": "fast", "steps": [1, 2]}, {"lr": 0.5, "steps": [0, 0]}, "sched")
    Traceback (most recent call last):
    ampkit.CheckpointError: sched['lr'] is a str in the checkpoint, where this run has a float
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._errors import CheckpointError
from ..fileio._rng import check_rng_state

if TYPE_CHECKING:
    from ..training._engine_protocol import EngineLike

__all__ = ["check_engine_state", "check_model", "check_optimizer", "check_training_payload", "conforms"]

_PAYLOAD_KEYS = ("engine", "models", "optimizers", "schedulers", "rng", "extra")


def _kind(value: Any) -> str:
    return "a tensor" if isinstance(value, torch.Tensor) else "None" if value is None else f"a {type(value).__name__}"


def _differs(where: str, saved: Any, reference: Any) -> CheckpointError:
    return CheckpointError(f"{where} is {_kind(saved)} in the checkpoint, where this run has {_kind(reference)}")


def conforms(saved: Any, reference: Any, where: str) -> None:
    """Raise CheckpointError unless ``saved`` has the shape of ``reference``: keys, lengths, value kinds, tensor shapes.

    ``reference`` is what the running object's own ``state_dict()`` returns. ``None`` on either side matches
    anything (attributes that are unset until first use). Numbers: an int stays an int, a float may be saved as
    an int.
    """
    if saved is None or reference is None:
        return
    if isinstance(reference, dict):
        if not isinstance(saved, dict):
            raise _differs(where, saved, reference)
        missing = [k for k in reference if k not in saved]
        extra = [k for k in saved if k not in reference]
        if missing or extra:
            raise CheckpointError(f"{where} has other entries than this run's (missing {missing[:5]}, unexpected {extra[:5]})")
        for key, value in saved.items():
            conforms(value, reference[key], f"{where}[{key!r}]")
    elif isinstance(reference, (list, tuple)):
        if not isinstance(saved, (list, tuple)):
            raise _differs(where, saved, reference)
        if len(saved) != len(reference):
            raise CheckpointError(f"{where} holds {len(saved)} entries in the checkpoint, {len(reference)} in this run")
        for i, (s, r) in enumerate(zip(saved, reference)):
            conforms(s, r, f"{where}[{i}]")
    elif isinstance(reference, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            raise _differs(where, saved, reference)
        if saved.shape != reference.shape:
            raise CheckpointError(f"{where} has shape {tuple(saved.shape)} in the checkpoint, {tuple(reference.shape)} in this run")
    elif isinstance(reference, bool) or isinstance(saved, bool):
        if type(saved) is not type(reference):
            raise _differs(where, saved, reference)
    elif isinstance(reference, int):
        if not isinstance(saved, int):
            raise _differs(where, saved, reference)
    elif isinstance(reference, float):
        if not isinstance(saved, (int, float)):
            raise _differs(where, saved, reference)
    elif isinstance(reference, str) and not isinstance(saved, str):
        raise _differs(where, saved, reference)


def check_model(i: int, model: torch.nn.Module, saved: Any, path: Any) -> None:
    """The saved state dict of model ``i`` has this model's keys, tensors only, of the same shapes."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: model {i}'s state in the checkpoint is {_kind(saved)}, not a state dict; is it an ampkit checkpoint?")
    current = model.state_dict()
    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    not_tensors = [k for k in current if k in saved and not isinstance(saved[k], torch.Tensor)]
    wrong = [k for k in current if k in saved and k not in not_tensors and tuple(saved[k].shape) != tuple(current[k].shape)]
    if missing or unexpected or wrong or not_tensors:
        raise CheckpointError(
            f"{path}: model {i} does not match the checkpoint (missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"shape mismatch {wrong[:3]}, not tensors {not_tensors[:3]}). Build the same model as the saved run before engine.load()."
        )


def _fits_parameter(value: torch.Tensor, param: torch.Tensor) -> bool:
    # torch.optim's per-parameter state is elementwise (moments, momentum), a one-element counter (step), or
    # factored along whole dimensions (Adafactor's row/column variances): each dimension equals or is 1.
    if value.numel() <= 1:
        return True
    return value.dim() == param.dim() and all(v in (p, 1) for v, p in zip(value.shape, param.shape))


def check_optimizer(i: int, opt: torch.optim.Optimizer, saved: Any, path: Any) -> None:
    """The saved state of optimizer ``i`` is one this optimizer loads: same class of settings, groups and state shapes."""
    name = type(opt).__name__
    where = f"{path}: optimizer {i} ({name})"
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) or not isinstance(saved.get("state"), dict):
        raise CheckpointError(f"{where}: the checkpoint's entry is not an optimizer state dict (needs 'state' and 'param_groups').")
    groups = saved["param_groups"]
    if len(groups) != len(opt.param_groups) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise CheckpointError(f"{where}: the checkpoint has {len(groups)} parameter groups, this optimizer {len(opt.param_groups)}; build it as the saved run did.")
    by_id: dict[Any, torch.Tensor] = {}
    for g, (mine, theirs) in enumerate(zip(opt.param_groups, groups)):
        if len(theirs["params"]) != len(mine["params"]):
            raise CheckpointError(f"{where}: an optimizer's parameter groups differ from the checkpoint's (group {g}: {len(theirs['params'])} vs {len(mine['params'])} parameters); build it as the saved run did.")
        # initial_lr is added by any LR scheduler built on the optimizer, whatever its class.
        foreign = sorted(k for k in theirs if k not in mine and k not in ("param_names", "initial_lr"))
        if foreign:
            raise CheckpointError(
                f"{where}: the checkpoint's parameter group {g} has settings {foreign} that {name} does not have; it was "
                f"saved from another optimizer class. Build the optimizer the saved run used."
            )
        for key, value in theirs.items():
            if key in ("params", "param_names", "initial_lr"):
                continue
            conforms(value, mine.get(key), f"{where} setting {key!r}")
        by_id.update(zip(theirs["params"], mine["params"]))
    for pid, entry in saved["state"].items():
        param = by_id.get(pid)
        if param is None or not isinstance(entry, dict):
            raise CheckpointError(f"{where}: the checkpoint holds state for parameter {pid!r}, which none of its parameter groups lists; the file is damaged.")
        current = opt.state.get(param)
        if current:  # this optimizer has state for the parameter already: the checkpoint's must have its form
            conforms(entry, dict(current), f"{where} state of parameter {pid}")
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and type(opt).__module__.startswith("torch.optim") and not _fits_parameter(value, param):
                raise CheckpointError(
                    f"{where}: state {key!r} of parameter {pid} has shape {tuple(value.shape)}, but the parameter has shape "
                    f"{tuple(param.shape)}; the checkpoint belongs to another model or optimizer setup."
                )


def _count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_engine_state(engine: EngineLike, state: Any) -> None:
    """The engine part of a checkpoint: every entry present, of the right type and range, and fitting this engine."""
    required = ("policy", "accumulate", "micro", "epoch_len", "steps", "skipped_steps", "scaler", "masters", "pending_grads")
    if not isinstance(state, dict) or any(k not in state for k in required):
        missing = [k for k in required if not isinstance(state, dict) or k not in state]
        raise CheckpointError(f"the checkpoint's engine state lacks {missing}; it was not written by Engine.save() (or is damaged).")
    if state["policy"] != engine.policy.name:
        raise CheckpointError(
            f"The checkpoint was written under policy {state['policy']!r}, but this engine runs {engine.policy.name!r}. "
            f"Resume with Engine(precision={state['policy']!r}); switching policy mid-run breaks exact resume."
        )
    counts = {"accumulate": 1, "micro": 0, "steps": 0, "skipped_steps": 0}
    bad = [f"{k}={state[k]!r}" for k, low in counts.items() if not _count(state[k], low)]
    bad += [f"{k}={state.get(k)!r}" for k in ("epoch_len", "micro_batch_rows") if state.get(k) is not None and not _count(state[k], 1)]
    rounding = state.get("rounding")  # bf16-true-sr's stream; absent from older checkpoints
    if rounding is not None and not (
        isinstance(rounding, dict) and (rounding.get("seed") is None or _count(rounding["seed"], 0)) and _count(rounding.get("draws"), 0)
    ):
        bad.append(f"rounding={rounding!r}")
    if not bad and state["skipped_steps"] > state["steps"]:
        bad.append(f"skipped_steps={state['skipped_steps']} > steps={state['steps']}")
    if bad:
        raise CheckpointError(f"the checkpoint's engine counters are invalid ({', '.join(bad)}); the file is damaged: load an earlier checkpoint.")
    _check_scaler(engine, state["scaler"])
    if state["pending_grads"] is not None and state["accumulate"] != engine.accumulate:
        raise CheckpointError(
            f"The checkpoint stopped inside an accumulation window of {state['accumulate']}; resume with accumulate={state['accumulate']}."
        )
    if (state["masters"] is None) != (engine.masters is None):
        raise CheckpointError("The checkpoint's master weights do not match this engine's policy setup.")
    if engine.masters is not None:
        if not isinstance(state["masters"], dict) or set(state["masters"]) != set(engine.masters.names):
            raise CheckpointError("The checkpoint's master weights name other parameters than this model has; is it the same model?")
        conforms(state["masters"], dict(zip(engine.masters.names, engine.masters.masters)), "the checkpoint's master weights")
    if state["pending_grads"] is not None:
        params = dict(engine.named_parameters())
        saved = state["pending_grads"]
        if not isinstance(saved, dict) or not set(saved) <= set(params):
            unknown = sorted(set(saved) - set(params))[:3] if isinstance(saved, dict) else saved
            raise CheckpointError(f"the checkpoint's pending gradients name parameters this model lacks ({unknown}); is it the same model?")
        conforms(saved, {n: params[n] for n in saved}, "the checkpoint's pending gradients")


def _check_scaler(engine: EngineLike, saved: Any) -> None:
    scaler = engine.scaler
    if (saved is None) != (scaler is None):
        raise CheckpointError("The checkpoint's loss-scaler setting differs from this engine's; pass the same scaler= as the saved run.")
    if scaler is None:
        return
    reference = scaler.state_dict()
    if not isinstance(saved, dict) or saved.get("kind") != reference.get("kind"):
        theirs = saved.get("kind") if isinstance(saved, dict) else saved
        raise CheckpointError(
            f"The checkpoint's loss scaler is {theirs!r}, this engine's is {reference.get('kind')!r}; pass the same scaler= as the "
            "saved run (a float for a static scale, 'dynamic' or a ScalerConfig for dynamic scaling)."
        )
    conforms(saved, reference, "the checkpoint's loss-scaler state")
    scale = saved.get("scale")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale < float("inf"):
        raise CheckpointError(f"the checkpoint's loss scale {scale!r} is not a positive finite number; the file is damaged.")


def check_training_payload(engine: EngineLike, payload: Any, path: Any) -> None:
    """Validate a checkpoint's payload against the running setup; raise CheckpointError naming the fix.

    A payload without models and optimizers (a sharded checkpoint's ``ampkit.pt``) is checked for the rest;
    the shards are checked against the model by :mod:`ampkit.checkpoint._sharded`.
    """
    if not isinstance(payload, dict) or any(k not in payload for k in _PAYLOAD_KEYS):
        raise CheckpointError(f"{path} is an ampkit file but not a training checkpoint written by Engine.save().")
    try:
        check_engine_state(engine, payload["engine"])
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    parts = [("schedulers", engine.schedulers)]
    if payload["models"] is not None:
        parts += [("models", engine.models), ("optimizers", engine.optimizers)]
    for what, mine in parts:
        if not isinstance(payload[what], list) or len(payload[what]) != len(mine):
            count = len(payload[what]) if isinstance(payload[what], list) else _kind(payload[what])
            raise CheckpointError(f"{path} holds {count} {what}, this run has {len(mine)}; set up the same ones.")
    for j, (sched, saved) in enumerate(zip(engine.schedulers, payload["schedulers"])):
        try:
            conforms(saved, sched.state_dict(), f"scheduler {j} ({type(sched).__name__})")
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}; build the LR scheduler the saved run used.") from None
    if payload["rng"] is not None:
        try:
            check_rng_state(payload["rng"])
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
    if payload["models"] is None:
        return
    for i, (model, saved) in enumerate(zip(engine.models, payload["models"])):
        check_model(i, model, saved, path)
    for i, (opt, saved) in enumerate(zip(engine.optimizers, payload["optimizers"])):
        check_optimizer(i, opt, saved, path)
