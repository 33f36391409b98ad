"""bf16-true-remainder against its control, bf16-true-masters: bitwise the same training at 2 bytes per parameter, not 8."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.memory._accounting import tensor_bytes, training_state_bytes
from ampkit.memory._estimate import estimate
from ampkit.policy._remainder_bits import tie_bytes
from ampkit.policy._remainder_masters import RemainderMasters
from ampkit.training._fused_master_step import fused_step_problem

OptFactory = Callable[..., torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptFactory] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))


def _batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def _train(engine: Engine, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    losses = []
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _run(policy: str, opt: OptFactory, steps: int = 6) -> tuple[Engine, nn.Module, torch.optim.Optimizer, torch.Tensor]:
    engine = Engine(policy)
    model = _model()
    model, optimizer = engine.setup(model, opt(model.parameters()))
    return engine, model, optimizer, _train(engine, model, _batches(steps))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(_bits(a[k]), _bits(b[k])) for k in a)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_is_bitwise_that_of_fp32_masters(name: str) -> None:
    ctrl_engine, ctrl_model, _, ctrl_losses = _run("bf16-true-masters", OPTIMIZERS[name])
    engine, model, _, losses = _run("bf16-true-remainder", OPTIMIZERS[name])
    assert isinstance(engine.masters, RemainderMasters)
    assert torch.equal(_bits(losses), _bits(ctrl_losses))
    assert _same_bits(dict(model.named_parameters()), dict(ctrl_model.named_parameters()))
    assert _same_bits(engine.masters.state_dict(), ctrl_engine.masters.state_dict())  # type: ignore[union-attr]


def test_a_channels_last_cnn_with_clipping_trains_bitwise_as_fp32_masters() -> None:
    # The clipping norm sums each gradient in memory order: the masters must keep the model's channels_last layout.
    def conv() -> nn.Module:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.Flatten(), nn.LazyLinear(5))
        net(torch.zeros(1, 3, 8, 8))
        return net.to(memory_format=torch.channels_last)

    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(4, 3, 8, 8, generator=g).to(memory_format=torch.channels_last), torch.randint(0, 5, (4,), generator=g)) for _ in range(4)]
    runs = {}
    for policy in ("bf16-true-masters", "bf16-true-remainder"):
        engine = Engine(policy, clip_grad_norm=0.5)
        model = conv()
        model, _ = engine.setup(model, OPTIMIZERS["adamw"](model.parameters()))
        runs[policy] = (engine, model, _train(engine, model, batches))
    (ctrl_engine, ctrl_model, ctrl_losses), (engine, model, losses) = runs.values()
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    # Strides only: between steps the masters have no storage, and a failing assert must not print their values.
    strides = [m.stride() for m in engine.masters.masters], [m.stride() for m in ctrl_engine.masters.masters]  # type: ignore[union-attr]
    assert strides[0] == strides[1]
    assert torch.equal(_bits(losses), _bits(ctrl_losses))
    assert _same_bits(engine.masters.state_dict(), ctrl_engine.masters.state_dict())  # type: ignore[union-attr]
    assert _same_bits(dict(model.named_parameters()), dict(ctrl_model.named_parameters()))


def test_a_master_that_lands_on_a_tie_rounded_down_comes_back_exactly() -> None:
    # 1 + 2^-8 is exactly halfway between the bf16 values 1 and 1 + 2^-7: RNE keeps 1, the remainder is +32768,
    # which int16 cannot hold. Two SGD steps of -2^-8 from 1 step through it; fp32 masters are the control.
    masters = {}
    for policy in ("bf16-true-masters", "bf16-true-remainder"):
        model = nn.Linear(1, 1, bias=False)
        nn.init.ones_(model.weight)
        engine = Engine(policy)
        model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=1.0))
        seen = []
        for _ in range(2):
            engine.backward(-(2**-8) * model(torch.ones(1, 1)).float().sum())
            engine.step()
            seen.append((engine.masters.state_dict()["weight"].clone(), model.weight.detach().clone()))  # type: ignore[union-attr]
        masters[policy] = seen
    ctrl, got = masters["bf16-true-masters"], masters["bf16-true-remainder"]
    assert ctrl[0][0].item() == 1 + 2**-8 and ctrl[0][1].item() == 1.0  # the tie, rounded down to even
    for (m_ctrl, w_ctrl), (m, w) in zip(ctrl, got):
        assert torch.equal(m.view(torch.int32), m_ctrl.view(torch.int32)) and torch.equal(w.view(torch.int16), w_ctrl.view(torch.int16))


def test_masters_cost_2_125_bytes_per_parameter_between_steps_and_8_only_inside_the_step() -> None:
    ctrl_engine, ctrl_model, ctrl_opt, _ = _run("bf16-true-masters", OPTIMIZERS["adamw"], steps=2)
    engine, model, optimizer, _ = _run("bf16-true-remainder", OPTIMIZERS["adamw"], steps=2)
    n = sum(p.numel() for p in model.parameters() if p.dtype == torch.bfloat16)  # LayerNorm stays fp32, without masters
    assert training_state_bytes(ctrl_model, [ctrl_opt], ctrl_engine.masters)["master_weights"] == 8 * n
    assert training_state_bytes(model, [optimizer], engine.masters)["master_weights"] == 2 * n + tie_bytes(n)
    inside: list[int] = []
    optimizer.register_step_pre_hook(lambda *_: inside.append(tensor_bytes(engine.masters.tensors())))  # type: ignore[union-attr]
    _train(engine, model, _batches(1, seed=5))
    assert inside == [8 * n + tie_bytes(n)]  # fp32 master and gradient (the remainders are freed meanwhile); tie bits


def test_the_memory_estimate_counts_2_125_bytes_per_parameter() -> None:
    batch = (torch.randn(4, 16), torch.randint(0, 4, (4,)))
    est = {p: estimate(_model(), batch, OPTIMIZERS["adamw"], policy=p, device="cpu") for p in ("bf16-true-masters", "bf16-true-remainder")}
    n = sum(p.numel() for p in _model().parameters()) - 2 * 32  # the LayerNorm keeps fp32, without masters
    assert est["bf16-true-masters"].master_weights == 8 * n
    assert est["bf16-true-remainder"].master_weights == 2 * n + tie_bytes(n)


def test_the_memory_peak_sees_the_fp32_storage_freed_between_steps() -> None:
    # Activations large enough that backward, not the optimizer step, is the peak: there fp32 masters hold their
    # 8 B/param and the remainder masters only 2. The storage is freed by a resize, which no op dispatches.
    batch = (torch.randn(2048, 16), torch.randint(0, 4, (2048,)))
    est = {p: estimate(_model(), batch, OPTIMIZERS["adamw"], policy=p, device="cpu") for p in ("bf16-true-masters", "bf16-true-remainder")}
    n = sum(p.numel() for p in _model().parameters()) - 2 * 32
    assert est["bf16-true-masters"].peak - est["bf16-true-remainder"].peak == 6 * n - tie_bytes(n)


def test_resume_is_bitwise(tmp_path: Path) -> None:
    batches = _batches(6)
    engine = Engine("bf16-true-remainder")
    model = _model()
    model, _ = engine.setup(model, OPTIMIZERS["adamw"](model.parameters()))
    _train(engine, model, batches[:3])
    engine.save(tmp_path / "ckpt.pt")
    ctrl_losses = _train(engine, model, batches[3:])

    resumed = Engine("bf16-true-remainder")
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)  # different weights: the checkpoint must bring back all of them
    other, _ = resumed.setup(other, OPTIMIZERS["adamw"](other.parameters()))
    resumed.load(tmp_path / "ckpt.pt")
    losses = _train(resumed, other, batches[3:])
    assert torch.equal(_bits(losses), _bits(ctrl_losses))
    assert _same_bits(dict(other.named_parameters()), dict(model.named_parameters()))
    assert _same_bits(resumed.masters.state_dict(), engine.masters.state_dict())  # type: ignore[union-attr]


def test_the_fused_master_step_is_refused_before_setup_changes_the_model() -> None:
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    assert fused_step_problem([opt], True, None, untraceable=RemainderMasters.untraceable) is not None
    with pytest.raises(ValueError, match="fused_step=False"):
        Engine("bf16-true-remainder", fused_step=True).setup(model, opt)
    assert model.weight.dtype == torch.float32  # refused before the policy cast anything
