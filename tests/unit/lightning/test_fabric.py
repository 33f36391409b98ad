"""``AmpkitPrecision`` under Lightning Fabric: the user's own loop (``fabric.backward``, ``fabric.clip_gradients``,
``optimizer.step()``), against Fabric's own precision and ampkit's Engine loop on the same weights and batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from ampkit.lightning import AmpkitPrecision
from ampkit.policy import get_policy

from .conftest import BATCH, INF, assert_same_weights, data, engine_loop, loss_of, net

CPU_POLICIES = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "bf16-true-masters", "bf16-true-remainder", "16-true-masters"]


def _loop(fabric: L.Fabric, *, clip: float | None = None, poison: set[int] = frozenset(), epochs: int = 1, state: Path | None = None,
          model: torch.nn.Module | None = None) -> tuple[torch.nn.Module, list[float], Any]:
    model = model if model is not None else net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    plugin = fabric.strategy.precision
    if state is not None:
        plugin.setup_optimizers(optimizer)  # the fp32 masters in the optimizer before its state is loaded
        fabric.load(state, {"model": model, "optimizer": optimizer, "precision": plugin})
    losses, step = [], 0
    for _ in range(epochs):
        for x, y in fabric.setup_dataloaders(torch.utils.data.DataLoader(data(), batch_size=BATCH), move_to_device=False):
            loss = loss_of(model(x), y)
            losses.append(loss.item())
            fabric.backward(loss)
            if step in poison:
                model.module[0].weight.grad[0, 0] = INF
            if clip is not None:
                # An overflowed step under loss scaling has a non-finite norm by design: it is skipped, not an error.
                fabric.clip_gradients(model, optimizer, max_norm=clip, error_if_nonfinite=False)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    return model, losses, (optimizer, plugin)


@pytest.mark.parametrize("policy", ["32-true", "bf16-mixed"])
def test_matches_fabrics_own_precision_bit_for_bit(policy: str) -> None:
    native, want, _ = _loop(L.Fabric(accelerator="cpu", precision=policy), clip=1.0)
    model, got, _ = _loop(L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision(policy)]), clip=1.0)
    assert got == want
    assert_same_weights(model.module, native.module)


@pytest.mark.parametrize("policy", CPU_POLICIES)
def test_every_policy_trains_as_ampkits_engine_loop(policy: str) -> None:
    """fabric.clip_gradients after the plugin unscales (and copies to the masters), and an overflow at step 3 under
    loss scaling: the same run as Engine(clip_grad_norm=1.0), loss for loss and weight for weight."""
    scaled = get_policy(policy).loss_scaling == "dynamic"
    poison = {3} if scaled else set()
    control, want, engine = engine_loop(policy, clip_grad_norm=1.0, poison=poison)
    model, got, (optimizer, plugin) = _loop(L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision(policy)]), clip=1.0, poison=poison)
    assert got == want
    assert_same_weights(model.module, control)
    assert plugin.engine.skipped_steps == engine.skipped_steps == len(poison)
    if engine.masters is not None:  # the optimizer Fabric holds steps the fp32 masters
        assert all(p.dtype == torch.float32 for p in optimizer.param_groups[0]["params"])


def test_a_run_saved_with_the_plugin_in_its_state_resumes_bit_for_bit(tmp_path: Path) -> None:
    policy = "16-true-masters"
    whole, want, _ = _loop(L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision(policy)]), poison={2}, epochs=2)
    fabric = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision(policy)])
    model, first, (optimizer, plugin) = _loop(fabric, poison={2})
    fabric.save(tmp_path / "state.pt", {"model": model, "optimizer": optimizer, "precision": plugin})
    resumed, second, (_, again) = _loop(L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision(policy)]), state=tmp_path / "state.pt")
    assert first + second == want
    assert_same_weights(resumed.module, whole.module)
    assert again.engine.scale == 2.0**15 and again.engine.skipped_steps == 1


def test_a_library_twin_is_refused_naming_the_optimizer_to_build() -> None:
    pytest.importorskip("optimi")
    with pytest.raises(ValueError, match="kahan_sum=True"):
        _loop(L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("bf16-true-kahan")]))


def test_a_state_loaded_before_the_masters_are_in_place_is_refused_with_the_fix(tmp_path: Path) -> None:
    """torch's Optimizer.load_state_dict casts the state to its parameters' dtype: loaded onto the 16-bit weights, Adam's
    second moments would lose what fp16 cannot hold. The plugin refuses to adopt such an optimizer."""
    fabric = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("16-true-masters")])
    model, _, (optimizer, plugin) = _loop(fabric)
    fabric.save(tmp_path / "state.pt", {"model": model, "optimizer": optimizer, "precision": plugin})
    again = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("16-true-masters")])
    model = net()
    model, optimizer = again.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    again.load(tmp_path / "state.pt", {"model": model, "optimizer": optimizer, "precision": again.strategy.precision})
    x, y = data()[:BATCH]
    again.backward(loss_of(model(x), y))
    with pytest.raises(RuntimeError, match=r"setup_optimizers\(optimizer\), then"):
        optimizer.step()


def test_a_checkpoint_without_the_plugins_state_gives_the_masters_the_loaded_weights(tmp_path: Path) -> None:
    """Saved without the plugin, loaded into a model initialised otherwise: the fp32 masters take the loaded (16-bit)
    weights, so the first step moves on from them, not from the fresh model's."""
    fabric = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("bf16-true-masters")])
    model, _, (optimizer, _) = _loop(fabric)
    fabric.save(tmp_path / "weights.pt", {"model": model, "optimizer": optimizer})
    again = L.Fabric(accelerator="cpu", plugins=[AmpkitPrecision("bf16-true-masters")])
    fresh = net(seed=7)
    fresh, opt = again.setup(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
    again.strategy.precision.setup_optimizers(opt)
    again.load(tmp_path / "weights.pt", {"model": fresh, "optimizer": opt})
    masters = again.strategy.precision.engine.masters
    assert all(torch.equal(m.to(p.dtype), p) for m, p in zip(masters.masters, masters.model_params))
    assert torch.equal(fresh.module[0].weight, model.module[0].weight)
