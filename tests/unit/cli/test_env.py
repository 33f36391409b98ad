"""Tests for ``ampkit env``: the shared facts, the JSON form and the tables (CPU only; CUDA is faked)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import ampkit
from ampkit.cli._env import RECOMMEND_ORDER, collect_env, recommend
from ampkit.cli._main import main
from ampkit.policy import ALIASES


def _env_json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["env", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def _support(facts: dict[str, Any], policy: str, device: str) -> dict[str, Any]:
    return next(p for p in facts["policies"] if p["name"] == policy)["support"][device]


def test_json_has_every_policy_and_the_required_keys(capsys: pytest.CaptureFixture[str]) -> None:
    facts = _env_json(capsys)
    assert {"ampkit", "torch", "python", "devices", "policies", "aliases", "recommended"} <= facts.keys()
    assert facts["ampkit"] == ampkit.__version__
    assert facts["torch"] == torch.__version__
    assert [p["name"] for p in facts["policies"]] == ampkit.policy_names()
    assert facts["aliases"] == ALIASES
    assert facts["devices"][0]["device"] == "cpu"
    for policy in facts["policies"]:
        assert policy["description"]
        for device in facts["devices"]:
            assert set(policy["support"][device["device"]]) == {"supported", "fast", "reason"}


def test_json_cpu_support_facts(capsys: pytest.CaptureFixture[str]) -> None:
    facts = _env_json(capsys)
    tf32 = _support(facts, "tf32", "cpu")
    assert tf32["supported"] is False
    assert "CUDA" in tf32["reason"]
    # bf16 runs on every CPU; whether it is *fast* depends on AMX/AVX512-BF16, so CI may differ.
    assert _support(facts, "bf16-mixed", "cpu")["supported"] is True


def test_recommendation_is_supported_and_keeps_fp32_weights(capsys: pytest.CaptureFixture[str]) -> None:
    facts = _env_json(capsys)
    name = facts["recommended"]["cpu"]
    assert name in RECOMMEND_ORDER
    assert _support(facts, name, "cpu")["supported"] is True
    assert ampkit.get_policy(name).param_dtype == torch.float32


@pytest.mark.parametrize(("bf16_native", "expected"), [(True, "bf16-mixed"), (False, "32-true")])
def test_recommend_follows_cpu_bf16(monkeypatch: pytest.MonkeyPatch, bf16_native: bool, expected: str) -> None:
    # Without bf16 hardware, bf16 and fp16 are both slow on CPU and tf32 is CUDA-only: only fp32 is left.
    monkeypatch.setattr("ampkit.policy._mixed.cpu_bf16_native", lambda: bf16_native)
    assert recommend("cpu") == expected


def test_table_lists_every_policy_alias_and_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ampkit.policy_names():
        assert name in out
    for alias in ALIASES:
        assert alias in out
    assert ampkit.__version__ in out
    assert torch.__version__ in out
    recommended = collect_env()["recommended"]["cpu"]
    assert f"recommended on cpu: {recommended} (" in out
    assert "\x1b[" not in out  # captured output is not a terminal: no colour codes in logs


@pytest.fixture
def fake_volta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend one pre-Ampere CUDA device (sm70: fp16 tensor cores, no bf16, no TF32) is present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=16 * 2**30))


def test_fake_cuda_device_is_listed_and_recommended_for(fake_volta: None, capsys: pytest.CaptureFixture[str]) -> None:
    facts = collect_env()
    assert [d["device"] for d in facts["devices"]] == ["cpu", "cuda:0"]
    gpu = facts["devices"][1]
    assert gpu["name"] == "Tesla V100-SXM2-16GB"
    assert gpu["capability"] == "7.0"
    assert gpu["total_memory_bytes"] == 16 * 2**30
    assert gpu["bf16_native"] is False
    assert _support(facts, "bf16-mixed", "cuda:0")["supported"] is False
    assert _support(facts, "tf32", "cuda:0")["supported"] is False
    assert facts["recommended"]["cuda:0"] == "16-mixed"
    json.dumps(facts)  # the JSON renderer must be able to serialise every fact

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "cuda:0" in out
    assert "Tesla V100-SXM2-16GB" in out
    assert "recommended on cuda:0: 16-mixed (" in out


# ------------------------------------------------------------------------------------------------ kernel guards
def test_json_lists_every_kernel_guard_with_the_devices_it_is_active_on(fake_volta: None, capsys: pytest.CaptureFixture[str]) -> None:
    from ampkit.training._kernel_guards import KNOWN_DEFECTS, torch_affected

    guards = {g["name"]: g for g in _env_json(capsys)["kernel_guards"]}
    assert list(guards) == [d.name for d in KNOWN_DEFECTS]
    for d in KNOWN_DEFECTS:
        expected = [dev for dev in ("cpu", "cuda:0") if torch_affected(d) and (d.devices is None or dev.split(":")[0] in d.devices)]
        assert guards[d.name]["active_on"] == expected
        assert guards[d.name]["workaround"] == d.workaround and guards[d.name]["upstream"] == d.upstream
    # The CPU-only defect is not active on the CUDA device; the device-independent one is, on this torch.
    assert "cuda:0" not in guards["fused-sgd-cpu-16bit"]["active_on"]


def test_table_shows_active_and_not_applicable_guards(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ampkit.training._kernel_guards import KNOWN_DEFECTS

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "Kernel guards" in out and all(d.name in out for d in KNOWN_DEFECTS)
    monkeypatch.setattr("ampkit.cli._env.torch_affected", lambda defect: False)  # a torch with every defect fixed
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "active on" not in out and out.count("not applicable") == len(KNOWN_DEFECTS)
