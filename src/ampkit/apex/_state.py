"""The process-wide amp state, under Apex's name ``_amp_state``, for code that reads it directly.

Scripts written for Apex log the loss scale with ``amp._amp_state.loss_scalers[0].loss_scale()`` and test
``hasattr(_amp_state, "opt_properties")`` to know whether initialize ran; both work here. The state is the
latest ``amp.initialize`` call's: as in Apex, a second call replaces ``loss_scalers`` with fresh ones, which
the first call's optimizers then use too. Scripts may assign ``loss_scalers[i]._loss_scale`` and set
``allow_incoming_model_not_fp32 = True`` before initialize to pass a model that is not all fp32.
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
        # Apex's switches, set by scripts (and Apex's own tests) around initialize: True lets a model with
        # parameters that are not fp32 through; hard_override is accepted and, as in Apex, nothing here reads it.
        self.allow_incoming_model_not_fp32 = False
        self.hard_override = False

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
