"""The device libraries' workspaces: allocated once per process, kept, and so no measured run's memory.

cuBLAS and cuBLASLt allocate a workspace through torch's caching allocator at the first matmul of each handle and
keep it for the process. A handle belongs to a thread and a stream, and autograd runs a CUDA backward on a thread
of its own: a forward's matmuls and a backward's each get theirs. An allocator baseline taken before them charges
them to whichever run comes first (bench's first policy, the fp32 reference, whose memory saving every other policy
is measured against). :func:`create_library_workspaces` pays them up front, in every dtype a policy's matmuls may
run in, forward and backward.

    >>> create_library_workspaces(torch.device("cpu"))  # nothing to create on the CPU
"""

from __future__ import annotations

import torch

__all__ = ["create_library_workspaces"]


def create_library_workspaces(device: torch.device) -> None:
    """Run one small matmul forward and backward in fp32, fp16 and bf16 on ``device`` (CUDA only), so the libraries'
    workspaces exist before an allocator baseline is taken. Synchronises once; call it outside a timed region."""
    if device.type != "cuda":
        return
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.ones(64, 64, device=device, dtype=dtype, requires_grad=True)
        (a @ a).sum().backward()  # the backward's matmuls run on autograd's device thread: its own handle
    torch.cuda.synchronize(device)
