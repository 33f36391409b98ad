"""The state a sharded checkpoint writes and reads with torch.distributed.checkpoint (DCP), shared by the
writer (:mod:`ampkit.checkpoint._sharded`) and the reader (:mod:`ampkit.checkpoint._sharded_load`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .._errors import CheckpointError

if TYPE_CHECKING:
    from ..training._engine_protocol import EngineLike

__all__ = ["grouped", "single_process_intended", "sharded_state", "optimizer_owner"]


def grouped() -> bool:
    """Whether a default process group is up, so that DCP and the collectives run across ranks."""
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def single_process_intended() -> Iterator[None]:
    """Silences DCP's warning about running without a process group, where that is the intent."""
    # DCP warns that it "assumes" a single process even when told so with no_dist=True; here it is the intent.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def sharded_state(engine: EngineLike) -> dict[str, Any]:
    """Model and optimizer state as DCP wants it: sharded tensors keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {}
    for i, model in enumerate(engine.models):
        state[f"model.{i}"] = get_model_state_dict(model)
    for j, opt in enumerate(engine.optimizers):
        state[f"optim.{j}"] = get_optimizer_state_dict(optimizer_owner(engine, opt), opt)
    return state


def optimizer_owner(engine: EngineLike, opt: torch.optim.Optimizer) -> torch.nn.Module:
    """The one model of ``engine`` whose parameters ``opt`` holds (DCP reads an optimizer's state through it)."""
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    for model in engine.models:
        if ids <= {id(p) for p in model.parameters()}:
            return model
    raise CheckpointError("a sharded checkpoint needs each optimizer to hold the parameters of one model; build one optimizer per model.")
