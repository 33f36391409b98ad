"""Exceptions raised by ampkit. Each message says what happened and what to do instead."""

from __future__ import annotations

__all__ = ["AmpkitError", "PolicyError", "UnsupportedPolicyError", "LossScaleCollapseError", "CheckpointError"]


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
