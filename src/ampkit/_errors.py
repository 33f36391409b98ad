"""Exceptions raised by ampkit. Each message says what happened and what to do instead."""

from __future__ import annotations

__all__ = ["one_line", "AmpkitError", "PolicyError", "UnsupportedPolicyError", "LossScaleCollapseError", "CheckpointError"]


class AmpkitError(Exception):
    """Base class of every error ampkit raises on purpose."""


class PolicyError(AmpkitError, ValueError):
    """A precision policy name or option is not valid."""


class UnsupportedPolicyError(PolicyError):
    """The policy is valid, but the device at hand cannot run it."""


class LossScaleCollapseError(AmpkitError, RuntimeError):
    """The dynamic loss scale hit its floor, or too many steps in a row were skipped."""


class CheckpointError(AmpkitError, RuntimeError):
    """A checkpoint could not be written or read; the previous state is untouched."""


# They are public as ampkit.AmpkitError, ...: tracebacks and pickles name them there, not by this internal module.
for _error in (AmpkitError, PolicyError, UnsupportedPolicyError, LossScaleCollapseError, CheckpointError):
    _error.__module__ = "ampkit"


def one_line(exc: BaseException, *, with_type: bool = False) -> str:
    r"""``exc``'s message on one line (tables and ``ampkit: error:`` lines promise one), optionally typed.

    >>> one_line(ValueError("bad\n  input"), with_type=True)
    'ValueError: bad input'
    """
    message = " ".join(str(exc).split())
    if not message:
        return type(exc).__name__
    return f"{type(exc).__name__}: {message}" if with_type else message
