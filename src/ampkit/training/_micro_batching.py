"""Automatic micro-batching: a step that runs out of memory is split into smaller pieces, and no sample is lost.

:meth:`ampkit.Engine.train_step` runs forward, backward and the optimizer step for a batch. When the forward
or the backward pass runs out of memory, the engine frees what the attempt held, halves the rows it feeds at
once, and carries on from the first row whose gradient is not yet accumulated: every sample contributes
once, and each piece's loss is weighted by its share of the rows, so the accumulated gradient is the unsplit
batch's (for a loss that averages over samples; ``reduction="sum"`` for one that sums). The smaller size is
kept for the following steps, and a warning says so once.

    >>> import torch
    >>> from torch import nn
    >>> from ampkit import Engine
    >>> from ampkit.memory._oom import MemoryBudget
    >>> model = nn.Linear(256, 256); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> engine = Engine(); model, opt = engine.setup(model, opt)
    >>> x = torch.randn(512, 256)
    >>> with MemoryBudget("2MiB", [*model.parameters(), x]):       # 512 rows at once need more
    ...     loss = engine.train_step(lambda rows: model(rows).pow(2).mean(), x)
    >>> engine.micro_batch_rows, engine.steps
    (128, 1)

A failed forward pass leaves the gradients untouched, so the step goes on from the row where it failed. A
failed backward pass has added part of its gradient; when the accumulation window began with this batch, the
engine clears the gradients and starts the batch over in smaller pieces (its rows are still at hand).

Limits: batch statistics (BatchNorm) are per piece, as with any micro-batching. A backward pass that fails
while gradients of *earlier* micro-batches of an accumulation window are pending cannot be undone without a
copy of them, which is memory the step does not have: then the error is raised with the fix (set
``micro_batch_rows`` from the start). Whenever the step gives up (that case, or out of memory even at one
row), no part of the batch stays in the gradients: at a window's start they are left as they were before the
step; inside a window the window's gradients are discarded (the error says so) and the next micro-batch
starts a new one. A batch of 0 rows is refused: it would count an optimizer step without a sample.
Under ``torchrun`` every rank uses the largest split any rank needs (one all-reduce of an int per step); an
out-of-memory error inside one rank's step is raised there, because the other ranks already wait in DDP's
gradient all-reduce and cannot be called back.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .._compat import tree_flatten, tree_unflatten
from ..distributed._agreement import agree_min, world_size
from ..distributed._ddp import no_sync
from ._oom import OutOfMemoryError, is_out_of_memory, release_memory

if TYPE_CHECKING:
    from ._engine_protocol import EngineLike, EngineLoop

__all__ = ["MicroBatcher", "batch_rows", "check_rows", "split_batch", "train_step"]

log = logging.getLogger("ampkit")

LossFn = Callable[[Any], torch.Tensor]


def batch_rows(batch: Any) -> int:
    """The number of samples in ``batch``: the shared first dimension of its tensors (0-dim ones are constants).

    >>> batch_rows({"x": torch.zeros(8, 3), "y": torch.zeros(8), "temperature": torch.tensor(0.5)})
    8
    """
    sizes = {t.shape[0] for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0}
    if len(sizes) != 1:
        what = "no tensor with a batch dimension" if not sizes else f"tensors whose first dimensions differ: {sorted(sizes)}"
        raise ValueError(
            f"train_step() needs a batch whose tensors share their first (sample) dimension; this one has {what}. "
            "Pass the batch as a tensor, tuple, list or dict of [N, ...] tensors."
        )
    return sizes.pop()


def split_batch(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in ``batch`` (views, no copy); other leaves unchanged.

    >>> split_batch((torch.arange(6), "label"), 2, 4)
    (tensor([2, 3]), 'label')
    """
    leaves, spec = tree_flatten(batch)
    return tree_unflatten([t[start:stop] if isinstance(t, torch.Tensor) and t.dim() > 0 else t for t in leaves], spec)


def check_rows(rows: Any) -> int | None:
    """``rows`` as ``micro_batch_rows`` takes it (an int >= 1, or None for the whole batch); else the error.

    >>> check_rows(0)
    Traceback (most recent call last):
    ...
    ValueError: micro_batch_rows must be an int >= 1 or None (the whole batch), got 0.
    """
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f"micro_batch_rows must be an int >= 1 or None (the whole batch), got {rows!r}.")
    return rows


class MicroBatcher:
    """The engine's micro-batching: the rows :meth:`train_step` feeds at once (``Engine.micro_batch_rows``, learnt after
    an out-of-memory error and kept in checkpoints), and what an out-of-memory error does (``on_oom``: ``"split"`` or
    ``"raise"``). Only it changes the rows, and only where it is told to or learns them.

    >>> batcher = MicroBatcher(rows=None, on_oom="split"); batcher.learn(64); batcher.rows
    64
    """

    def __init__(self, rows: int | None, on_oom: str) -> None:
        if on_oom not in ("split", "raise"):
            raise ValueError(f"on_oom={on_oom!r}: pass 'split' (retry in smaller passes) or 'raise'.")
        self.rows = check_rows(rows)
        self.on_oom = on_oom

    def learn(self, rows: int | None) -> None:
        """Feed at most ``rows`` rows at once from now on (after an out-of-memory error, or as the user says)."""
        self.rows = check_rows(rows)

    def train_step(self, engine: EngineLoop, loss_fn: LossFn, batch: Any, optimizers: tuple[torch.optim.Optimizer, ...], reduction: str) -> torch.Tensor:
        """Forward, backward and step of ``batch`` through ``engine`` (see :func:`train_step`)."""
        return train_step(engine, self, loss_fn, batch, optimizers, reduction)


def train_step(
    engine: EngineLoop, batcher: MicroBatcher, loss_fn: LossFn, batch: Any, optimizers: tuple[torch.optim.Optimizer, ...], reduction: str
) -> torch.Tensor:
    """Forward, backward and step of ``batch`` through ``engine``, split on out-of-memory as ``batcher`` says (and
    learns). See ``Engine.train_step``."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"train_step(reduction={reduction!r}): pass 'mean' (the loss averages over samples) or 'sum'.")
    n = batch_rows(batch)
    if n == 0:
        raise ValueError(
            "train_step() got a batch of 0 rows: it would count an optimizer step (and move the LR schedule) without "
            "a sample. Skip empty batches before calling it (e.g. DataLoader(drop_last=True), or filter them out)."
        )
    distributed = world_size() > 1
    rows = min(n, batcher.rows or n)
    pieces: int | None = None
    if distributed:
        # Every rank must run the same number of backward passes, or DDP's all-reduces pair up wrongly: the
        # largest count any rank needs, in near-equal pieces (ranks may hold different numbers of rows).
        pieces = -agree_min(-math.ceil(n / rows))
        rows = math.ceil(n / pieces)
    window_start = not engine.micro_batches_pending
    done, passes = 0, 0
    total: torch.Tensor | None = None
    loss: torch.Tensor | None  # None once a failed pass lets go of it
    while done < n:
        stop = min(n, done + rows) if pieces is None else (passes + 1) * n // pieces
        piece = split_batch(batch, done, stop)
        weight = (stop - done) / n if reduction == "mean" else 1.0
        failure: BaseException | None = None
        in_backward = False
        try:
            with no_sync(engine.wrappers) if stop < n else contextlib.nullcontext():
                with engine.autocast():
                    loss = loss_fn(piece)
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                    raise TypeError(f"train_step()'s loss_fn must return the scalar loss tensor of its rows, got {type(loss).__name__}"
                                    f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}.")
                in_backward = True
                engine.backward(loss * weight if weight != 1.0 else loss)
            detached = loss.detach().float() * weight
            total = detached if total is None else total + detached
            done, passes = stop, passes + 1
            continue
        except Exception as exc:  # only allocation failures are handled; the rest re-raise
            if not is_out_of_memory(exc) or batcher.on_oom != "split":
                raise
            failure = exc
        # Outside the except block, so the failed attempt's frames and activations can be freed.
        loss = piece = None
        # A failed forward left the gradients alone: go on from `done`. A failed backward added part of its
        # gradient: start the batch over if the window began with it (its rows are at hand), else give up.
        partial = in_backward and not window_start
        if partial or distributed or rows == 1:
            reason = _unrecoverable(rows, partial, distributed) + _drop_partial_gradients(engine, window_start, done, in_backward)
            release_memory(failure)
            raise OutOfMemoryError(reason) from failure
        failed_rows = stop - done
        if in_backward:
            for m in engine.models:
                m.zero_grad(set_to_none=True)
            done, total = 0, None
        release_memory(failure)
        del failure
        rows = math.ceil(rows / 2)
        batcher.learn(rows)
        log.warning(
            "out of memory at %d rows per pass in step %d: splitting into passes of %d rows from now on "
            "(gradients unchanged; Engine(micro_batch_rows=%d) skips the failed try next time).",
            failed_rows, engine.steps + 1, rows, rows,
        )
    engine.step(*optimizers)
    return total  # type: ignore[return-value]  # not None: n >= 1, and every pass that ends the loop sets it


def _drop_partial_gradients(engine: EngineLike, window_start: bool, done: int, in_backward: bool) -> str:
    """Leave no part of a failed batch in the gradients; say in the error what that cost."""
    if not done and not in_backward:
        return ""  # the failure came before this batch added anything
    # At a window start the gradients were empty before this batch: emptying them restores them exactly.
    # Later in a window, this batch's share cannot be taken out of the sums without a copy the step had no
    # memory for: the whole window goes, and the next micro-batch starts a new one.
    pending = engine.micro_batches_pending
    for m in engine.models:
        m.zero_grad(set_to_none=True)
    if window_start:
        return " The gradients are as they were before this step."
    engine.step_state.discard_window(engine.accumulate)
    return (f" The gradients of this accumulation window ({pending} earlier micro-batch(es)) held part of this batch and were "
            "discarded; the next micro-batch starts a new window.")


def _unrecoverable(rows: int, partial: bool, distributed: bool) -> str:
    if rows == 1:
        return "out of memory with a single row per pass; nothing smaller can be tried. Free device memory, recompute activations (ampkit.recompute) or shard the model."
    if distributed:
        return (f"out of memory on this rank at {rows} rows per pass; under torchrun one rank cannot retry a step alone (the others "
                f"already wait in the gradient all-reduce). Restart with Engine(micro_batch_rows={math.ceil(rows / 2)}).")
    return (f"out of memory in backward at {rows} rows per pass with gradients of earlier rows of this accumulation window "
            f"pending; retrying would need a copy of them. Start with Engine(micro_batch_rows={math.ceil(rows / 2)}).")
