"""Logging once per run instead of once per rank.

With eight ranks every info line and warning would print eight times, and the one rank whose message differs
would be lost among them. :func:`log_on_rank_zero` lets rank 0 log everything and the other ranks only errors
(which are theirs alone, so they are prefixed with the rank); :func:`rank_zero_only` runs a function on rank 0.

    >>> @rank_zero_only
    ... def announce(msg): return msg
    >>> announce("saved")          # a single process is rank 0
    'saved'
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch.distributed as dist

__all__ = ["rank", "RankZeroFilter", "log_on_rank_zero", "rank_zero_only"]

F = TypeVar("F", bound=Callable[..., Any])


def rank() -> int:
    """This process's global rank: the process group's, else torchrun's ``RANK``, else 0.

    >>> rank() == int(os.environ.get("RANK", 0))
    True
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class RankZeroFilter(logging.Filter):
    """Keeps every record on rank 0; on other ranks only errors, marked with the rank they come from."""

    def filter(self, record: logging.LogRecord) -> bool:
        r = rank()
        if r == 0:
            return True
        if record.levelno < logging.ERROR:
            return False
        if not getattr(record, "_ampkit_rank_marked", False):
            record.msg = f"[rank {r}] {record.msg}"
            record._ampkit_rank_marked = True
        return True


def log_on_rank_zero(logger: str | logging.Logger = "ampkit") -> None:
    """Install :class:`RankZeroFilter` on ``logger`` (once; calling again changes nothing).

    >>> log_on_rank_zero(); sum(isinstance(f, RankZeroFilter) for f in logging.getLogger("ampkit").filters) >= 1
    True
    """
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    if not any(isinstance(f, RankZeroFilter) for f in target.filters):
        target.addFilter(RankZeroFilter())


def rank_zero_only(fn: F) -> F:
    """Run ``fn`` on rank 0 only; other ranks get None (no collective inside ``fn``, or the others would wait)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if rank() == 0 else None

    return cast(F, wrapper)  # wraps() keeps the signature; F says so to the type checker
