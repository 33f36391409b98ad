"""Fixtures for the policy tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

FakeGpu = Callable[[tuple[int, int], str], None]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    """Pretend one CUDA device of the given compute capability and name is present (on a CPU-only build)."""

    def install(capability: tuple[int, int], name: str) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return install
