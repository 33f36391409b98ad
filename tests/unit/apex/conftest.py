"""Each test starts without an amp session, amp flags, an amp handle or an installed apex finder, and leaves none
behind."""

from __future__ import annotations

import importlib
import sys

import pytest

from ampkit.apex import uninstall
from ampkit.apex._state import _amp_state


@pytest.fixture(autouse=True)
def _fresh_amp_state():
    _amp_state.__dict__.clear()
    _amp_state.__init__()
    yield
    handle = _amp_state.__dict__.get("handle")
    if handle is not None and handle.is_active():  # a test that failed before handle._deactivate()
        handle._deactivate()
    _amp_state.__dict__.clear()  # also what a test set on it (allow_incoming_model_not_fp32, ...)
    _amp_state.__init__()
    uninstall()


@pytest.fixture
def forget_apex_modules():
    """Also drop every ``apex`` module a test imported, a real Apex's included (fake ones live in tmp dirs)."""
    yield
    uninstall()
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
