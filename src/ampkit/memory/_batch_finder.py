"""The largest batch size a real training step runs at, found by trying it: out-of-memory errors are expected.

:func:`find_max_batch_size` calls a trial function (a step or two of training at a given batch size) at
doubling sizes until one runs out of memory, then bisects between the last size that ran and the first that
did not. After each failure it frees what the attempt held before the next try (see
:func:`~ampkit.memory.release_memory`); any other exception is a bug and propagates at once. Under
torchrun every rank tries the same sizes and a size counts as fitting only if it fits on every rank, so all
ranks return the same answer.

Use it as a function or as a decorator, with or without arguments:

    >>> import torch
    >>> from ampkit.memory._oom import MemoryBudget
    >>> def trial(batch_size):
    ...     with MemoryBudget(1 << 20):           # pretend the device holds 1 MiB
    ...         torch.zeros(batch_size, 1024)     # 4 KiB per sample
    >>> find_max_batch_size(trial)()
    256
    >>> @find_max_batch_size(start=8, multiple_of=8)
    ... def trial(batch_size, width):
    ...     with MemoryBudget(1 << 20):
    ...         torch.zeros(batch_size, width)
    >>> trial(1000)
    256

Prefer :func:`~ampkit.memory.largest_batch` to *predict* the answer without the device (no OOM at all);
use this one on the device itself, where the allocator's rounding, fragmentation and workspaces count too.
On a CPU an allocation fails only after the machine has swapped (or the OOM killer has ended the process), so
there the search needs a budget to run out of: the trial's body inside :class:`~ampkit.memory.MemoryBudget`,
as in the examples, or a ``limit``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any, overload

from ..distributed._agreement import agree_min
from ._oom import OutOfMemoryError, is_out_of_memory, release_memory

__all__ = ["find_max_batch_size", "BatchSizeNotFoundError"]

log = logging.getLogger("ampkit")

class BatchSizeNotFoundError(OutOfMemoryError):  # type: ignore[misc,valid-type]
    """Even the smallest batch size ran out of memory."""


def _fits(trial: Callable[..., Any], batch_size: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Run one try; True if it ran, False after an out-of-memory error (memory freed), agreed over ranks."""
    failure: BaseException | None = None
    try:
        trial(batch_size, *args, **kwargs)
    except Exception as exc:  # only allocation failures are kept; the rest re-raise below
        if not is_out_of_memory(exc):
            raise
        failure = exc
    ok = failure is None
    # Outside the except block the traceback's frames (and the activations they hold) can be dropped. After a
    # successful try too: garbage cycles it left would otherwise count against the next, larger one.
    release_memory(failure)
    del failure
    ok = bool(agree_min(int(ok)))
    log.info("batch size %d: %s", batch_size, "fits" if ok else "out of memory")
    return ok


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Keep what existed before the search out of the collections each try ends with (``gc.freeze``).

    Every try ends with a full ``gc.collect()`` so its garbage cycles cannot count against the next one. In a large
    process (transformers, torch.compile, a notebook) that walks millions of older objects each time, seconds per
    search; the garbage of a try is never among them. Skipped when something else froze objects already: unfreezing
    would undo its freeze too.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _search(trial: Callable[..., Any], start: int, limit: int, multiple_of: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    step = multiple_of
    if _fits(trial, start, args, kwargs):
        lo, hi = start, None
        while hi is None and lo < limit:
            size = min(lo * 2, limit)
            if _fits(trial, size, args, kwargs):
                lo = size
            else:
                hi = size
        if hi is None:
            return lo  # the limit itself fits
    else:
        hi, lo = start, 0
        while lo == 0:
            size = hi // 2 // step * step
            if size < step:
                raise BatchSizeNotFoundError(
                    f"Batch size {step} runs out of memory already; nothing smaller can be tried. Free memory on the "
                    "device, use a 16-bit policy, recompute activations (ampkit.recompute) or shard the model."
                )
            if _fits(trial, size, args, kwargs):
                lo = size
            else:
                hi = size
    # lo fits, hi does not: bisect on multiples of `step`.
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if _fits(trial, mid, args, kwargs):
            lo = mid
        else:
            hi = mid
    return lo


@overload
def find_max_batch_size(trial: Callable[..., Any], *, start: int | None = ..., limit: int = ..., multiple_of: int = ...) -> Callable[..., int]: ...
@overload
def find_max_batch_size(trial: None = None, *, start: int | None = ..., limit: int = ..., multiple_of: int = ...) -> Callable[[Callable[..., Any]], Callable[..., int]]: ...


def find_max_batch_size(
    trial: Callable[..., Any] | None = None,
    *,
    start: int | None = None,
    limit: int = 2**16,
    multiple_of: int = 1,
) -> Any:
    """Turn ``trial(batch_size, *args, **kwargs)`` into a search for the largest batch size that runs.

    ``find_max_batch_size(trial)`` returns the search; call it with the trial's remaining arguments to run it
    and get the size: ``find_max_batch_size(trial)(model)``. As a decorator, ``@find_max_batch_size`` or
    ``@find_max_batch_size(limit=512)``, the decorated name is that search.

    Args:
        trial: runs one or two training steps at the batch size it is given; build the batch inside it (a
            step that succeeds once may still fail with the optimizer state it allocated, so two steps is safer).
        start: first size tried (default ``multiple_of``); sizes double from there, then are bisected.
        limit: largest size tried; returned if it fits.
        multiple_of: every size tried is a multiple of it (8 suits tensor cores).

    Every size is tried on every rank of a torchrun job and fits only if it fits everywhere (one all-reduce per
    try), so all ranks return the same size. Raises :class:`BatchSizeNotFoundError` if ``multiple_of`` fails.
    """
    for name, value in (("limit", limit), ("multiple_of", multiple_of)) + ((("start", start),) if start is not None else ()):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"find_max_batch_size({name}={value!r}): pass a positive int.")
    first = multiple_of if start is None else start
    if first % multiple_of or limit < first:
        raise ValueError(
            f"find_max_batch_size(start={first}, limit={limit}, multiple_of={multiple_of}): start must be a multiple "
            "of multiple_of and no larger than limit."
        )

    def decorate(fn: Callable[..., Any]) -> Callable[..., int]:
        if not callable(fn):
            raise TypeError(f"find_max_batch_size() takes the trial function, got {type(fn).__name__}.")

        @functools.wraps(fn)
        def search(*args: Any, **kwargs: Any) -> int:
            with _older_objects_frozen():
                return _search(fn, first, limit, multiple_of, args, kwargs)

        return search

    return decorate if trial is None else decorate(trial)
