"""The device a workload runs on: the default one, and what a tool's result file records about it.

    >>> default_device().type in ("cpu", "cuda"), device_info(torch.device("cpu"))["type"]
    (True, 'cpu')
"""

from __future__ import annotations

from typing import Any

import torch

from ..policy._device import cpu_bf16_native, cpu_fp16_native, cpu_name

__all__ = ["default_device", "device_info"]


def default_device() -> torch.device:
    """The first CUDA device when there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def device_info(device: torch.device) -> dict[str, Any]:
    """What results.json (the bench) and profile.json record about the device the workload ran on."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
        }
    if device.type == "cpu":
        return {
            "type": "cpu",
            "name": cpu_name(),
            "threads": torch.get_num_threads(),
            "bf16_native": cpu_bf16_native(),
            "fp16_native": cpu_fp16_native(),
        }
    return {"type": device.type, "name": str(device)}
