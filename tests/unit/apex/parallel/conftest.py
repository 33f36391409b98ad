"""A one-process gloo group on the CPU: enough for torch's DDP and SyncBatchNorm to run their real code paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
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
