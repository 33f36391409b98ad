"""One-process groups: enough for torch's DDP and SyncBatchNorm to run their real code paths.

``process_group`` is gloo on the CPU (for the CPU-only tests); ``device_process_group`` follows the pass's device:
gloo on the CPU, NCCL bound to the pass's GPU on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def device_process_group(tmp_path: Path, device: torch.device) -> Iterator[None]:
    if not dist.is_available():
        pytest.skip("torch built without torch.distributed")
    init = f"file://{tmp_path / 'store'}"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init, rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
