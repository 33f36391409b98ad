"""The process-wide amp state, under Apex's name ``_amp_state``, for code that reads it directly.

Scripts written for Apex log the loss scale with ``amp._amp_state.loss_scalers[0].loss_scale()`` and test
``hasattr(_amp_state, "opt_properties")`` to know whether initialize ran; both work here. The state is the
latest ``amp.initialize`` call's; optimizers keep a link to the call that patched them.
"""

from __future__ import annotations

from typing import Any

from ._session import AmpSession

__all__ = ["AmpState", "_amp_state"]


class AmpState:
    """Holds the current :class:`AmpSession`; exposes Apex's attribute names once initialize has run."""

    def __init__(self) -> None:
        self.session: AmpSession | None = None
        self.disabled = False  # the latest initialize had enabled=False

    def __getattr__(self, name: str) -> Any:
        session = self.__dict__.get("session")
        if session is not None:
            if name == "loss_scalers":
                return session.views
            if name == "opt_properties":
                return session.properties
            if name in ("verbosity", "min_loss_scale", "max_loss_scale"):
                return getattr(session, name)
        raise AttributeError(f"amp state has no attribute {name!r} (amp.initialize has not run, or Apex never had it)")


_amp_state = AmpState()
