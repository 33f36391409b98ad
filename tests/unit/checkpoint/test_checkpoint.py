"""Exact resume: a run stopped after step k and resumed ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit import CheckpointError, Engine, ScalerConfig

STEPS = 8


class Net(nn.Module):
    """Dropout makes the run depend on the RNG, LayerNorm on the fp32 islands of the master policies."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def micro_batch(i: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)  # data depends on the index only, as a resumable loader's would
    return torch.randn(16, 8, generator=g).to(device), torch.randint(0, 3, (16,), generator=g).to(device)


def build(precision: str, accumulate: int, seed: int, device: torch.device = torch.device("cpu")) -> tuple[Engine, nn.Module]:
    model = Net(seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    scaler = ScalerConfig(init_scale=2.0**8, growth_interval=2) if "16-" in precision else None
    engine = Engine(precision, accumulate=accumulate, clip_grad_norm=1.0, scaler=scaler)
    model, _ = engine.setup(model, opt, schedulers=sched)
    return engine, model


def train(engine: Engine, model: nn.Module, start: int, stop: int) -> None:
    for i in range(start, stop):
        x, y = micro_batch(i, engine.device)
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        if i == 5 and engine.scaler is not None:
            model.body[0].weight.grad.fill_(float("inf"))  # a skipped step inside the resumed part
        engine.step()


def move_generators_on(device: torch.device) -> None:
    torch.rand(1000)
    torch.rand(1000, device=device)


def snapshot(engine: Engine, model: nn.Module) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    if engine.masters is not None:
        tensors += [m.detach().clone() for m in engine.masters.masters]
    return tensors


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true-masters", "16-true-masters"])
@pytest.mark.parametrize("accumulate, stop_at", [(1, 3), (3, 7)], ids=["at-boundary", "mid-window"])
def test_resume_is_bitwise_exact(tmp_path: Path, precision: str, accumulate: int, stop_at: int, device: torch.device) -> None:
    total = STEPS * accumulate
    torch.manual_seed(123)  # seeds every CUDA generator too: Dropout draws from the device's own
    ref_engine, ref_model = build(precision, accumulate, seed=0, device=device)
    train(ref_engine, ref_model, 0, total)

    torch.manual_seed(123)
    engine, model = build(precision, accumulate, seed=0, device=device)
    train(engine, model, 0, stop_at)
    engine.save(tmp_path / "ckpt.pt", extra={"next_micro_batch": stop_at})
    move_generators_on(device)  # the checkpoint must bring them back

    resumed_engine, resumed_model = build(precision, accumulate, seed=99, device=device)  # other weights: load overwrites them
    extra = resumed_engine.load(tmp_path / "ckpt.pt")
    assert extra == {"next_micro_batch": stop_at}
    train(resumed_engine, resumed_model, stop_at, total)

    for a, b in zip(snapshot(resumed_engine, resumed_model), snapshot(ref_engine, ref_model)):
        assert torch.equal(a, b)
    assert resumed_engine.steps == ref_engine.steps == STEPS
    assert resumed_engine.skipped_steps == ref_engine.skipped_steps
    assert resumed_engine.scale == ref_engine.scale
    assert resumed_engine.schedulers[0].get_last_lr() == ref_engine.schedulers[0].get_last_lr()
    if engine.scaler is not None:
        assert ref_engine.skipped_steps == 1


def optimizer_tensors(engine: Engine) -> list[torch.Tensor]:
    return [v.cpu() for s in engine.optimizers[0].state_dict()["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]


def test_a_checkpoint_saved_on_the_device_resumes_bitwise_there_after_a_trip_through_the_cpu(
    tmp_path: Path, device: torch.device, mixed_policy: str
) -> None:
    """Save on the device mid-window (pending gradients, a moved loss scale), load into a CPU run, save that,
    load it back onto the device: the run then ends bitwise equal to one never interrupted."""
    accumulate, stop_at, total = 3, 7, STEPS * 3
    torch.manual_seed(123)
    ref_engine, ref_model = build(mixed_policy, accumulate, seed=0, device=device)
    train(ref_engine, ref_model, 0, total)

    torch.manual_seed(123)
    engine, model = build(mixed_policy, accumulate, seed=0, device=device)
    train(engine, model, 0, stop_at)
    engine.save(tmp_path / "device.pt")

    cpu_engine, cpu_model = build(mixed_policy, accumulate, seed=98)
    cpu_engine.load(tmp_path / "device.pt")
    for a, b in zip(snapshot(cpu_engine, cpu_model), snapshot(engine, model)):
        assert a.device.type == "cpu" and torch.equal(a, b.cpu())
    for a, b in zip(optimizer_tensors(cpu_engine), optimizer_tensors(engine)):
        assert torch.equal(a, b)
    assert (cpu_engine.steps, cpu_engine.step_state.micro, cpu_engine.scale) == (engine.steps, engine.step_state.micro, engine.scale)
    cpu_engine.save(tmp_path / "cpu.pt")
    move_generators_on(device)

    resumed_engine, resumed_model = build(mixed_policy, accumulate, seed=99, device=device)
    resumed_engine.load(tmp_path / "cpu.pt")
    assert all(p.device == model.body[0].weight.device for p in snapshot(resumed_engine, resumed_model))
    train(resumed_engine, resumed_model, stop_at, total)
    for a, b in zip(snapshot(resumed_engine, resumed_model), snapshot(ref_engine, ref_model)):
        assert torch.equal(a, b)
    for a, b in zip(optimizer_tensors(resumed_engine), optimizer_tensors(ref_engine)):
        assert torch.equal(a, b)
    assert (resumed_engine.steps, resumed_engine.skipped_steps, resumed_engine.scale) == (ref_engine.steps, ref_engine.skipped_steps, ref_engine.scale)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_run_saved_on_a_gpu_resumes_on_a_machine_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save tags each storage with its device; a GPU machine's file says "cuda:0" (written here by tagging
    the storages so), which torch.load refuses without CUDA unless told where to map them."""
    torch.manual_seed(123)
    engine, model = build("16-mixed", 3, seed=0)
    train(engine, model, 0, 7)
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        engine.save(tmp_path / "gpu.pt")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(tmp_path / "gpu.pt", weights_only=True)
    resumed, resumed_model = build("16-mixed", 3, seed=99)
    resumed.load(tmp_path / "gpu.pt")
    for a, b in zip(snapshot(resumed, resumed_model), snapshot(engine, model)):
        assert torch.equal(a, b)
    assert (resumed.steps, resumed.step_state.micro, resumed.scale) == (engine.steps, engine.step_state.micro, engine.scale)


def test_checkpoint_stores_fp32_masters_not_just_the_16_bit_model(tmp_path: Path) -> None:
    engine, model = build("bf16-true-masters", 1, seed=0)
    train(engine, model, 0, 2)
    engine.save(tmp_path / "c.pt")
    state = torch.load(tmp_path / "c.pt", weights_only=True)["payload"]
    masters = state["engine"]["masters"]
    assert masters["body.0.weight"].dtype == torch.float32
    assert torch.equal(masters["body.0.weight"], engine.masters.masters[0])
    assert state["models"][0]["body.0.weight"].dtype == torch.bfloat16


def _unchanged(model: nn.Module, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_checkpoint_of_another_policy_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    engine, model = build("16-mixed", 1, seed=0)
    train(engine, model, 0, 2)
    engine.save(tmp_path / "c.pt")
    other, other_model = build("bf16-mixed", 1, seed=5)
    before = [p.detach().clone() for p in other_model.parameters()]
    with pytest.raises(CheckpointError, match=r"policy '16-mixed'.*Engine\(precision='16-mixed'\)"):
        other.load(tmp_path / "c.pt")
    assert _unchanged(other_model, before) and other.steps == 0


def test_truncated_checkpoint_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    engine, model = build("32-true", 1, seed=0)
    train(engine, model, 0, 2)
    path = tmp_path / "c.pt"
    engine.save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    fresh, fresh_model = build("32-true", 1, seed=5)
    before = [p.detach().clone() for p in fresh_model.parameters()]
    with pytest.raises(CheckpointError):
        fresh.load(path)
    assert _unchanged(fresh_model, before) and fresh.steps == 0


def test_checkpoint_of_another_model_is_refused_before_anything_is_loaded(tmp_path: Path) -> None:
    engine, model = build("32-true", 1, seed=0)
    engine.save(tmp_path / "c.pt")
    small = nn.Sequential(nn.Linear(8, 3))
    other = Engine("32-true")
    other.setup(small, torch.optim.AdamW(small.parameters()), schedulers=None)
    before = [p.detach().clone() for p in small.parameters()]
    with pytest.raises(CheckpointError):
        other.load(tmp_path / "c.pt")
    assert _unchanged(small, before)


def test_unsafe_extra_is_refused_at_save_and_the_old_checkpoint_survives(tmp_path: Path) -> None:
    engine, model = build("32-true", 1, seed=0)
    path = tmp_path / "c.pt"
    engine.save(path)
    good = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"extra\['fn'\] holds a function"):
        engine.save(path, extra={"fn": print})
    assert path.read_bytes() == good


def test_save_and_load_need_setup(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="before engine.setup"):
        Engine().save(tmp_path / "c.pt")
    with pytest.raises(RuntimeError, match="before engine.setup"):
        Engine().load(tmp_path / "c.pt")


def test_mid_window_checkpoint_needs_the_same_accumulation(tmp_path: Path) -> None:
    engine, model = build("32-true", 3, seed=0)
    train(engine, model, 0, 2)
    engine.save(tmp_path / "c.pt")
    other, _ = build("32-true", 2, seed=0)
    with pytest.raises(CheckpointError, match="accumulate=3"):
        other.load(tmp_path / "c.pt")
