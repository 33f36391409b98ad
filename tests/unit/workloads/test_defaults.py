"""The workload every tool runs when not told, and at which size; the device it runs on and what results record of it."""

from __future__ import annotations

import torch

from ampkit.workloads._defaults import default_size, default_workload, workload_size
from ampkit.workloads._device import device_info

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_default_workload_and_size() -> None:
    assert default_workload(CPU) == "digits" and default_workload(GPU) == "gpt"
    assert default_size(CPU) == "small" and default_size(GPU) == "large"


def test_auto_is_the_devices_size_and_a_named_size_is_kept() -> None:
    assert workload_size("auto", CPU) == "small" and workload_size("auto", GPU) == "large"
    assert workload_size("tiny", GPU) == "tiny"


def test_a_cpu_is_recorded_with_its_threads_and_native_half_formats() -> None:
    info = device_info(CPU)
    assert info["type"] == "cpu" and info["threads"] == torch.get_num_threads()
    assert isinstance(info["bf16_native"], bool) and isinstance(info["fp16_native"], bool) and info["name"]
