"""Each test starts without an amp session, an amp handle or an installed apex finder, and leaves none behind."""

from __future__ import annotations

import pytest

from ampkit.apex import uninstall
from ampkit.apex._state import _amp_state


@pytest.fixture(autouse=True)
def _fresh_amp_state():
    _amp_state.session, _amp_state.disabled = None, False
    yield
    _amp_state.session, _amp_state.disabled = None, False
    handle = _amp_state.__dict__.pop("handle", None)
    if handle is not None and handle.is_active():  # a test that failed before handle._deactivate()
        handle._deactivate()
    uninstall()
