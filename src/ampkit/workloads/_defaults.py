"""The workload a tool runs when not told: which one, at which size, on which device.

Chosen per machine, for every tool alike (bench, memory, doctor; the profile has a default workload of its own):

- device: the GPU when there is one, else the CPU (:func:`ampkit.workloads.default_device`);
- workload: the one that shows the effect best there and checks accuracy with an eval metric. On a CPU that is
  ``digits`` (real data; measured on the development machine: bf16-mixed 1.65x faster than fp32 with 36%
  less activation memory, against 1.44x for ``gpt``, whose CPU attention kernel is slower in bf16, and 1.24x
  for ``segment``; ``resnet`` has no eval metric). On a GPU it is ``gpt``: transformer matmuls are what tensor
  cores accelerate most;
- size: ``small`` on CPU (<= 2 minutes on 2 cores), ``large`` on a GPU: for ``gpt``, GPT-2 small's transformer
  at 8 x 1024 tokens a step, the shape GPU users train; a small model would only measure kernel-launch latency.

    >>> default_workload(torch.device("cpu")), default_size(torch.device("cpu")), workload_size("auto", torch.device("cuda"))
    ('digits', 'small', 'large')
"""

from __future__ import annotations

import torch

__all__ = ["default_size", "default_workload", "workload_size"]


def default_workload(device: torch.device) -> str:
    """``gpt`` on a GPU, ``digits`` on a CPU: where each shows the effect best (see the module notes)."""
    return "gpt" if device.type == "cuda" else "digits"


def default_size(device: torch.device) -> str:
    """``small`` on CPU (the 2-minute budget), ``large`` on a GPU."""
    return "large" if device.type == "cuda" else "small"


def workload_size(size: str, device: torch.device) -> str:
    """``--size``, with ``auto`` resolved for ``device`` (:func:`default_size`)."""
    return default_size(device) if size == "auto" else size
