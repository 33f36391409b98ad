"""Device facts: device normalisation, the Support record, and the CPU/CUDA capability probes."""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Iterator

import pytest
import torch

from ampkit.policy import _device as device_mod
from ampkit.policy._device import (
    Support,
    as_device,
    cpu_bf16_native,
    cpu_fp16_native,
    cuda_bf16_supported,
    cuda_tf32_supported,
)


@pytest.fixture
def fresh_cpu_flags() -> Iterator[None]:
    """Drop the cached CPU flags before and after, so a faked /proc/cpuinfo neither sees nor leaks a cache."""
    device_mod._cpu_flags.cache_clear()
    yield
    device_mod._cpu_flags.cache_clear()


def _fake_cpuinfo(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(device_mod, "open", lambda *a, **k: io.StringIO(text), raising=False)


def _proc_cpuinfo_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    pytest.skip("/proc/cpuinfo has no flags line on this machine")


# ------------------------------------------------------------------------------------- as_device
@pytest.mark.parametrize(
    "given, expected",
    [
        (None, torch.device("cpu")),
        ("cpu", torch.device("cpu")),
        (torch.device("cpu"), torch.device("cpu")),
        ("cuda:1", torch.device("cuda", 1)),
        (torch.device("cuda", 2), torch.device("cuda", 2)),
        (0, torch.device("cuda", 0)),
        (3, torch.device("cuda", 3)),
        ("meta", torch.device("meta")),
    ],
)
def test_as_device_normalises(given: object, expected: torch.device) -> None:
    result = as_device(given)  # type: ignore[arg-type]
    assert isinstance(result, torch.device)
    assert result == expected


def test_bare_cuda_gets_the_current_index_when_cuda_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert as_device("cuda") == torch.device("cuda", 3)
    assert as_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert as_device("cuda:1") == torch.device("cuda", 1), "an explicit index must win over the current device"


def test_bare_cuda_stays_unindexed_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert as_device("cuda") == torch.device("cuda")
    assert as_device("cuda").index is None


# ------------------------------------------------------------------------------------- Support
def test_support_has_the_three_fields_in_order() -> None:
    s = Support(True, False, "why")
    assert [f.name for f in dataclasses.fields(Support)] == ["supported", "fast", "reason"]
    assert (s.supported, s.fast, s.reason) == (True, False, "why")
    assert s == Support(supported=True, fast=False, reason="why")
    assert s != Support(True, True, "why")


def test_support_is_frozen_and_slotted() -> None:
    s = Support(True, True, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.fast = False  # type: ignore[misc]
    assert not hasattr(s, "__dict__")
    assert hash(s) == hash(Support(True, True, "x"))


# ------------------------------------------------------------------------------------- CPU flags
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_cpu_bf16_native_agrees_with_proc_cpuinfo(fresh_cpu_flags: None) -> None:
    flags = _proc_cpuinfo_flags()
    assert cpu_bf16_native() is bool({"amx_bf16", "avx512_bf16"} & flags)
    assert cpu_fp16_native() is ("amx_fp16" in flags)


@pytest.mark.parametrize(
    "flags, bf16, fp16",
    [
        ("fpu sse avx2 avx512f", False, False),
        ("fpu avx512f avx512_bf16", True, False),
        ("fpu amx_tile amx_bf16 amx_int8", True, False),
        ("fpu amx_bf16 amx_fp16", True, True),
        ("fpu avx512_bf16x", False, False),  # whole flags only, not substrings
    ],
)
def test_cpu_flags_are_read_from_the_flags_line(
    monkeypatch: pytest.MonkeyPatch, fresh_cpu_flags: None, flags: str, bf16: bool, fp16: bool
) -> None:
    _fake_cpuinfo(monkeypatch, f"processor\t: 0\nmodel name\t: Fake CPU amx_bf16\nflags\t\t: {flags}\nbugs\t\t: amx_bf16\n")
    assert cpu_bf16_native() is bf16
    assert cpu_fp16_native() is fp16


def test_cpu_flags_fall_back_to_torch_probes_without_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch, fresh_cpu_flags: None) -> None:
    def no_file(*args: object, **kwargs: object) -> None:
        raise OSError("no /proc here")

    monkeypatch.setattr(device_mod, "open", no_file, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert cpu_bf16_native() is True
    assert cpu_fp16_native() is False

    device_mod._cpu_flags.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert cpu_bf16_native() is False

    device_mod._cpu_flags.cache_clear()
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert cpu_bf16_native() is False, "missing probes mean no bf16, not an AttributeError"


def test_cpu_without_a_flags_line_falls_back_to_torch_probes(monkeypatch: pytest.MonkeyPatch, fresh_cpu_flags: None) -> None:
    # ARM's /proc/cpuinfo has "Features", not "flags": its words are not read as x86 flags.
    _fake_cpuinfo(monkeypatch, "processor\t: 0\nFeatures\t: fp asimd bf16 avx512_bf16\n")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert cpu_bf16_native() is False

    device_mod._cpu_flags.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert cpu_bf16_native() is True


def test_cpu_flags_are_read_once(monkeypatch: pytest.MonkeyPatch, fresh_cpu_flags: None) -> None:
    opened = []

    def counting_open(*args: object, **kwargs: object) -> io.StringIO:
        opened.append(args)
        return io.StringIO("flags\t: avx512_bf16\n")

    monkeypatch.setattr(device_mod, "open", counting_open, raising=False)
    for _ in range(3):
        assert cpu_bf16_native()
        cpu_fp16_native()
    assert len(opened) == 1


# ------------------------------------------------------------------------------------- CUDA capability
@pytest.mark.parametrize("capability, expected", [((6, 1), False), ((7, 5), False), ((8, 0), True), ((8, 6), True), ((9, 0), True)])
def test_cuda_bf16_and_tf32_need_sm80(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], expected: bool) -> None:
    asked = []

    def fake_capability(device: object = None) -> tuple[int, int]:
        asked.append(device)
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", fake_capability)
    dev = torch.device("cuda", 1)
    assert cuda_bf16_supported(dev) is expected
    assert cuda_tf32_supported(dev) is expected
    assert asked == [dev, dev], "the capability of the device asked about, not of the current one"


def test_a_bool_is_not_taken_for_a_cuda_index() -> None:
    with pytest.raises(TypeError, match="CUDA index"):
        as_device(True)  # type: ignore[arg-type]
