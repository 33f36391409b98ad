"""The device libraries' workspaces, paid up front: afterwards no matmul, forward or backward, keeps memory."""

from __future__ import annotations

import pytest
import torch

from ampkit.memory._workspaces import create_library_workspaces


def test_after_the_workspaces_exist_no_matmul_in_any_dtype_keeps_memory(device: torch.device) -> None:
    if device.type != "cuda":
        pytest.skip("the CPU's matmuls keep no workspace: only the CUDA pass can see one")
    create_library_workspaces(device)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.randn(256, 256, device=device, dtype=dtype, requires_grad=True)
        (a @ a.t()).square().sum().backward()
        del a
    torch.cuda.synchronize(device)
    # Before the warm-up this held the cuBLAS/cuBLASLt workspaces of the forward's and the backward's handles.
    assert torch.cuda.memory_allocated(device) == base

