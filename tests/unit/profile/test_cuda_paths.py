"""The profile's CUDA-only paths, run by ``pytest --device cuda`` on a GPU (the GPU suite's test step): syncs found
through ``torch.cuda.set_sync_debug_mode`` at the user's line (printing and ``.tolist()`` included), the GPU's
idle time read from the trace, and the phases read from CUDA events. Skipped on the CPU pass."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.profile import Profiler, SyncFinder

pytestmark = pytest.mark.gpu


def test_every_sync_is_found_at_its_line_and_the_debug_mode_restored(device: torch.device) -> None:
    x = torch.ones(64, device=device)
    before = torch.cuda.get_sync_debug_mode()
    with SyncFinder(device) as syncs:
        for _ in range(3):
            value = x.sum().item()  # sync: item
            listed = x[:2].tolist()  # sync: tolist (no dispatch on the CPU; the debug mode sees it)
    sites = {s.code: s for s in syncs.sites()}
    assert sites["value = x.sum().item()  # sync: item"].count == 3
    assert sites["listed = x[:2].tolist()  # sync: tolist (no dispatch on the CPU; the debug mode sees it)"].count == 3
    assert all(s.where.startswith(f"{__file__}:") for s in syncs.sites())
    assert torch.cuda.get_sync_debug_mode() == before and value == 64 and listed == [1.0, 1.0]


def test_an_idle_gpu_is_seen_in_the_trace_and_the_phases_read_from_events(device: torch.device) -> None:
    engine = Engine("bf16-mixed")
    model = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 1)).to(device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), fused=True))
    batches = [torch.randn(256, 512) for _ in range(12)]

    def slow_batches():
        for b in batches:
            time.sleep(0.02)  # the host is late with every batch: the GPU idles meanwhile
            yield b

    with Profiler(engine, warmup=2, plain_steps=2, timed=4, sync_steps=0, trace_steps=3) as profiler:
        for x in profiler.batches(slow_batches()):
            with engine.autocast():
                loss = model(x).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
    data = profiler.result()
    assert data["device_idle"] is not None and data["device_idle"]["share"] > 0.5
    assert data["phases"]["data"]["median_s"] == pytest.approx(0.02, rel=0.5)  # device time between events
