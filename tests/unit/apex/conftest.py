"""Each test starts without an amp session, amp flags, an amp handle or an installed apex finder, and leaves none
behind. ``apex_step`` and ``torch_amp_step`` are one step of Apex's loop and of the torch.amp loop it stands for."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from ampkit.apex import uninstall
from ampkit.apex._properties import HALF_DTYPE_ENV, resolve_half_dtype
from ampkit.apex._state import _amp_state


@pytest.fixture(autouse=True)
def _shim_default_is_the_pass_half_dtype(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device-generic test's shim defaults to the pass's 16-bit type, which ``--half`` may set apart from the
    device's own (fp16 on the CPU reproduces the CUDA pass): the test then checks Apex's default as the CUDA pass
    sees it. Reads the pass's choice from the config, not the ``half_dtype`` fixture, which would make every test here
    device-generic."""
    if "device" not in request.fixturenames:
        return
    half = request.config.test_half  # type: ignore[attr-defined]  # "fp16" or "bf16", names the shim takes too
    if resolve_half_dtype(request.config.test_device.type, half) != resolve_half_dtype(request.config.test_device.type):  # type: ignore[attr-defined]
        monkeypatch.setenv(HALF_DTYPE_ENV, half)


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


@pytest.fixture
def apex_step():
    """``apex_step(model, opt, x, y)``: one step of Apex's loop (amp.scale_loss around backward) on a cross-entropy loss."""
    from ampkit.apex import amp

    def step(model, opt, x, y) -> None:
        opt.zero_grad()
        with amp.scale_loss(torch.nn.functional.cross_entropy(model(x).float(), y), opt) as scaled:
            scaled.backward()
        opt.step()

    return step


@pytest.fixture
def torch_amp_step(half_dtype):
    """``torch_amp_step(model, opt, scaler, x, y)``: one step of the torch.amp loop Apex's O1 stands for (autocast in
    the pass's 16-bit type around the forward, the GradScaler around backward and step)."""

    def step(model, opt, scaler, x, y) -> None:
        opt.zero_grad()
        with torch.autocast(x.device.type, dtype=half_dtype):
            out = model(x)
        scaler.scale(torch.nn.functional.cross_entropy(out.float(), y)).backward()
        scaler.step(opt)
        scaler.update()

    return step
