"""fp8-tensorwise / fp8-rowwise: device gating, the layer filter, and training against the bf16-mixed control.

On the CPU the policies run torchao's emulation (``emulate=True``): fp8's rounding, bf16's speed. On a GPU pass
(``--device cuda`` on sm89+) the same tests run the real fp8 kernels.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit._errors import PolicyError
from ampkit.policy import FP8Rowwise, FP8Tensorwise, get_policy
from ampkit.policy._fp8 import DEFAULT_TOKENS, missing_torchao
from ampkit.policy._fp8_roofline import predict_linear
from ampkit.policy._gpu_specs import gpu_spec

from .conftest import FakeGpu

RECIPES = [FP8Tensorwise, FP8Rowwise]


def _needs_torchao() -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")


def _policy(cls: type, device: torch.device, **kwargs) -> FP8Tensorwise:
    _needs_torchao()
    policy = cls(emulate=device.type == "cpu", **kwargs)
    if not policy.support(device).supported:
        pytest.skip(policy.support(device).reason)
    return policy


# -- names and device gating ---------------------------------------------------------------------
def test_names_and_alias() -> None:
    assert get_policy("fp8").name == "fp8-tensorwise" and get_policy("FP8-rowwise").name == "fp8-rowwise"
    p = get_policy("fp8-rowwise", keep_fp32=["head"])
    assert p.compute_dtype == torch.bfloat16 and p.param_dtype == torch.float32 and p.loss_scaling == "none"
    assert p.keep_fp32 == ("head",) and not p.emulate and p.layers == "auto"


def test_the_cpu_is_refused_with_the_reason_and_emulation_runs() -> None:
    _needs_torchao()
    s = get_policy("fp8").support("cpu")
    assert not s.supported and "no fp8 matrix units" in s.reason and "bf16-mixed" in s.reason
    with pytest.raises(Exception, match="cannot run on cpu"):
        Engine("fp8").setup(nn.Sequential(nn.Linear(16, 16)), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1))
    e = FP8Tensorwise(emulate=True).support("cpu")
    assert e.supported and not e.fast


def test_without_torchao_the_policy_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    s = FP8Tensorwise(emulate=True).support("cpu")
    assert not s.supported and "pip install 'ampkit[fp8]'" in s.reason
    assert missing_torchao() == s.reason


def test_without_torchao_the_device_that_cannot_run_fp8_is_named_first(monkeypatch: pytest.MonkeyPatch, fake_gpu: FakeGpu) -> None:
    # Installing torchao would not make a CPU or an A100 run fp8: the reason that stands is said first, and the
    # install after it, for the GPU the user moves to.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    cpu = FP8Tensorwise().support("cpu").reason
    assert cpu.startswith("cpu has no fp8 matrix units") and cpu.index("no fp8 matrix units") < cpu.index("pip install 'ampkit[fp8]'")
    fake_gpu((8, 0), "NVIDIA A100-SXM4-80GB")
    a100 = FP8Tensorwise().support("cuda").reason
    assert "sm80" in a100 and a100.index("sm80") < a100.index("pip install 'ampkit[fp8]'")
    fake_gpu((9, 0), "NVIDIA H100 80GB HBM3")
    h100 = FP8Tensorwise().support("cuda")
    assert not h100.supported and h100.reason == missing_torchao()  # the GPU can: only the install is missing


@pytest.mark.parametrize("cls, first", [(FP8Tensorwise, (8, 9)), (FP8Rowwise, (9, 0))])
def test_cuda_gating_by_compute_capability(fake_gpu: FakeGpu, cls: type, first: tuple[int, int]) -> None:
    _needs_torchao()
    fake_gpu((8, 0), "NVIDIA A100-SXM4-80GB")
    s = cls().support("cuda")
    assert not s.supported and "sm80" in s.reason and f"sm{first[0]}.{first[1]}+" in s.reason
    fake_gpu(first, "NVIDIA H100 80GB HBM3" if first == (9, 0) else "NVIDIA L4")
    assert cls().support("cuda").supported and cls().support("cuda").fast


def test_bad_settings_are_refused_naming_the_fix() -> None:
    with pytest.raises(PolicyError, match="layers must be"):
        FP8Tensorwise(layers="some")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="positive int"):
        FP8Tensorwise(tokens=0)
    with pytest.raises(PolicyError, match="one of .*H100"):
        FP8Tensorwise(target="A100")  # no fp8


# -- which layers --------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(4096, 4096)
        self.small = nn.Linear(64, 64)
        self.odd = nn.Linear(4096, 4100)
        self.head = nn.Linear(4096, 4096)
        self.attn = nn.MultiheadAttention(64, 4)


def test_auto_converts_the_layers_the_roofline_predicts_faster(fake_gpu: FakeGpu) -> None:
    fake_gpu((9, 0), "NVIDIA H100 80GB HBM3")
    with torch.device("meta"):
        net = Net()
    plans = {p.name: p for p in get_policy("fp8", keep_fp32=["head"]).plan_layers(net, "cuda")}
    assert plans["big"].convert and plans["big"].cost == predict_linear(gpu_spec("H100"), DEFAULT_TOKENS, 4096, 4096)  # type: ignore[arg-type]
    assert not plans["small"].convert and "slower in fp8" in plans["small"].reason
    assert not plans["odd"].convert and "multiples of 16" in plans["odd"].reason
    assert not plans["head"].convert and "keep_fp32" in plans["head"].reason
    assert not plans["attn.out_proj"].convert and "MultiheadAttention" in plans["attn.out_proj"].reason
    # Fewer tokens per micro-batch: the same layer becomes memory-bound and loses.
    few = {p.name: p for p in FP8Tensorwise(tokens=64).plan_layers(net, "cuda")}
    assert not few["big"].convert
    # The filter plans for the device trained on: an L4's bandwidth is low relative to its fp8 peak.
    fake_gpu((8, 9), "NVIDIA L4")
    l4 = {p.name: p for p in FP8Tensorwise().plan_layers(net, "cuda")}
    assert l4["big"].cost == predict_linear(gpu_spec("L4"), DEFAULT_TOKENS, 4096, 4096)  # type: ignore[arg-type]
    assert {p.name: p for p in FP8Tensorwise(target="H200").plan_layers(net, "cuda")}["big"].cost == predict_linear(
        gpu_spec("H200"), DEFAULT_TOKENS, 4096, 4096  # type: ignore[arg-type]
    )


def test_all_and_a_callable_override_the_roofline_but_not_the_kernels_rule() -> None:
    with torch.device("meta"):
        net = Net()
    every = {p.name for p in FP8Tensorwise(layers="all").plan_layers(net, "cpu") if p.convert}
    assert every == {"big", "small", "head"}
    mine = {p.name for p in FP8Tensorwise(layers=lambda m, name: name in ("small", "odd")).plan_layers(net, "cpu") if p.convert}
    assert mine == {"small"}


def test_conversion_swaps_only_the_chosen_layers_and_keeps_the_parameters() -> None:
    _needs_torchao()
    from torchao.float8.float8_linear import Float8Linear

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10), nn.Linear(10, 32))
    params = [id(p) for p in model.parameters()]
    FP8Tensorwise(emulate=True, layers="all").convert_module(model, "cpu")
    assert [type(m) is Float8Linear for m in model] == [True, False, False, False]  # 10 is no multiple of 16
    assert [id(p) for p in model.parameters()] == params  # optimizers built before setup stay valid


def test_a_root_linear_is_refused_and_no_conversion_warns(caplog: pytest.LogCaptureFixture) -> None:
    _needs_torchao()
    with pytest.raises(PolicyError, match="wrap it"):
        FP8Tensorwise(emulate=True, layers="all").convert_module(nn.Linear(16, 16), "cpu")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        FP8Tensorwise(emulate=True).convert_module(nn.Sequential(nn.Linear(16, 16)), "cpu")
    assert "no Linear layer is converted" in caplog.text and "slower in fp8" in caplog.text


def test_hugging_face_conv1d_layers_are_planned_and_named_not_converted(hf_conv1d: type[nn.Module], fake_gpu: FakeGpu) -> None:
    # GPT-2's projections are Conv1D: a Linear whose weight is stored (in, out). torchao swaps only nn.Linear, so the
    # plan lists them at their matmul's shape, never converts them, and says why, whatever the filter.
    fake_gpu((9, 0), "NVIDIA H100 80GB HBM3")
    with torch.device("meta"):
        model = nn.Sequential(hf_conv1d(16384, 4096), nn.GELU(), hf_conv1d(4096, 16384), nn.Linear(4096, 4096))
    for layers in ("auto", "all"):
        plans = {p.name: p for p in FP8Tensorwise(layers=layers).plan_layers(model, "cuda")}
        assert list(plans) == ["0", "2", "3"] and plans["3"].convert and plans["3"].kind == "Linear"
        for name, (k, n) in {"0": (4096, 16384), "2": (16384, 4096)}.items():
            assert plans[name].cost == predict_linear(gpu_spec("H100"), DEFAULT_TOKENS, k, n)  # type: ignore[arg-type]
            assert plans[name].kind == "Conv1D" and not plans[name].convert
            assert "torchao converts only nn.Linear" in plans[name].reason


def test_conversion_leaves_conv1d_layers_as_they_are_and_warns_naming_them(hf_conv1d: type[nn.Module], caplog: pytest.LogCaptureFixture) -> None:
    _needs_torchao()
    from torchao.float8.float8_linear import Float8Linear

    model = nn.Sequential(hf_conv1d(64, 32), nn.GELU(), nn.Linear(64, 32))
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        FP8Tensorwise(emulate=True, layers="all").convert_module(model, "cpu")
    assert type(model[0]) is hf_conv1d and type(model[2]) is Float8Linear
    assert "1 Conv1D layer (0) stays in bf16" in caplog.text and "nn.Linear" in caplog.text


# -- training ------------------------------------------------------------------------------------
def _gpt(device: torch.device):
    from ampkit.workloads import _gpt as gpt

    w = gpt.build("tiny")
    return w, w.model.to(device)


def _train(policy, device: torch.device, steps: int, model=None, engine=None, start: int = 0):
    w, fresh = _gpt(device)
    model = fresh if model is None else model
    if engine is None:
        engine = Engine(policy)
        model, _ = engine.setup(model, w.optimizer(model.parameters()))
    losses = []
    for i in range(start, start + steps):
        x, y = (t.to(device) for t in w.train_batches[i % len(w.train_batches)])
        with engine.autocast():
            loss = w.loss_fn(model(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu(), model, engine


@pytest.mark.parametrize("cls", RECIPES, ids=["tensorwise", "rowwise"])
def test_training_tracks_bf16_mixed_within_fp8_tolerance(device: torch.device, cls: type) -> None:
    policy = _policy(cls, device, layers="all")
    from torchao.float8.float8_linear import Float8Linear

    control, _, _ = _train("bf16-mixed", device, 12)
    treated, model, _ = _train(policy, device, 12)
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 5  # every Linear of the tiny GPT
    assert control[-1] < control[0] - 0.5  # the control learns
    # fp8 really ran: its losses differ from bf16's, but by little next to what training moves them.
    assert not torch.equal(treated, control)
    assert (treated - control).abs().max() < 0.02 * (control[0] - control[-1])


def test_resume_is_bitwise(device: torch.device, tmp_path: Path) -> None:
    """Dynamic scaling keeps no state: the fp32 weights and the optimizer's state are the whole checkpoint."""
    policy = _policy(FP8Tensorwise, device, layers="all")
    _, model, engine = _train(policy, device, 3)
    engine.save(tmp_path / "ckpt.pt")
    control, model, engine = _train(policy, device, 4, model, engine, start=3)
    want = {n: p.detach().clone() for n, p in model.named_parameters()}

    w, other = _gpt(device)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)  # different weights: the checkpoint must bring them back
    resumed = Engine(policy)
    other, _ = resumed.setup(other, w.optimizer(other.parameters()))
    resumed.load(tmp_path / "ckpt.pt")
    again, other, _ = _train(policy, device, 4, other, resumed, start=3)
    assert torch.equal(again, control)
    assert all(torch.equal(p, want[n]) for n, p in other.named_parameters())


def test_recompute_gives_the_same_gradients(device: torch.device) -> None:
    """Checkpointed blocks recompute their fp8 casts in backward; with dynamic scales they are the same casts."""
    from ampkit.memory._recompute import recompute
    from ampkit.workloads._gpt import Block

    policy = _policy(FP8Tensorwise, device, layers="all")
    plain, _, plain_engine = _train(policy, device, 3)
    _, model = _gpt(device)
    recompute(model, [Block])
    again, model, _ = _train(policy, device, 3, model)
    assert torch.equal(again, plain)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain_engine.models[0].parameters(), strict=True))


def test_policy_copies_keep_their_settings() -> None:
    p = FP8Rowwise(emulate=True, layers="all", tokens=512)
    q = p.with_keep_fp32("head")
    assert (q.emulate, q.layers, q.tokens, q.keep_fp32) == (True, "all", 512, ("head",))
    assert dataclasses.replace(p, emulate=False).sharded().fp8_all_gather is False  # rowwise: no fp8 all-gather
    assert FP8Tensorwise().sharded().fp8_all_gather is True


def test_an_uncompiled_gpu_run_is_told_to_compile(device: torch.device, caplog: pytest.LogCaptureFixture) -> None:
    policy = _policy(FP8Tensorwise, device, layers="all")
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        _train(policy, device, 1)
    assert ("without torch.compile" in caplog.text) == (device.type == "cuda")  # the CPU's emulation is never fast
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        w, model = _gpt(device)
        Engine(policy, compile=True).setup(model, w.optimizer(model.parameters()))
    assert "without torch.compile" not in caplog.text


def test_compiled_fp8_traces_whole_and_matches_eager(device: torch.device) -> None:
    """torchao needs torch.compile to fuse its casts: the model must compile without a graph break. With aot_eager
    (the captured graph run unfused) the compiled run ends bitwise where the eager one does."""
    from torch._dynamo.utils import counters

    policy = _policy(FP8Tensorwise, device, layers="all")
    eager, eager_model, _ = _train(policy, device, 3)
    torch._dynamo.reset()
    counters.clear()
    try:
        w, model = _gpt(device)
        engine = Engine(policy, compile={"backend": "aot_eager"})
        model, _ = engine.setup(model, w.optimizer(model.parameters()))
        compiled, model, _ = _train(policy, device, 3, model, engine)
        breaks = sum(counters["graph_break"].values())
    finally:
        torch._dynamo.reset()
    assert engine.compiled == [""] and breaks == 0
    assert torch.equal(compiled, eager)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), eager_model.parameters(), strict=True))
