"""init_distributed under torchrun's variables: the backend follows the device (NCCL on CUDA, gloo on the CPU), an
NCCL group is bound to its GPU, and a world of one trains through the engine's DDP and ends cleanly."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine
from ampkit.distributed import _environment as environment, init_distributed, shutdown


def _torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # NCCL, like gloo, meets its peers through torchrun's store at MASTER_ADDR:MASTER_PORT
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def test_a_world_of_one_on_the_device_picks_its_backend_trains_and_ends(monkeypatch: pytest.MonkeyPatch, device: torch.device):
    _torchrun_env(monkeypatch)
    assert not dist.is_initialized()
    try:
        env = init_distributed(device=device, rank_zero_logging=False)
        assert (env.rank, env.world_size, env.device) == (0, 1, device)
        assert env.backend == dist.get_backend() == ("nccl" if device.type == "cuda" else "gloo")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        control = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        control.load_state_dict(model.state_dict())
        engine = Engine(strategy="ddp")
        wrapped, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
        assert wrapped.device_ids == ([device.index] if device.type == "cuda" else None)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).to(device)
        engine.backward(wrapped(x).square().mean())
        engine.step()
        control_opt = torch.optim.SGD(control.parameters(), lr=0.1)
        control(x).square().mean().backward()
        control_opt.step()
        for a, b in zip(engine.models[0].parameters(), control.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # a world of one averages over itself: the plain step
    finally:
        shutdown()  # its barrier warns (an error here) when an NCCL group is not bound to its GPU
    assert not dist.is_initialized()


def test_an_nccl_group_is_bound_to_its_gpu(monkeypatch: pytest.MonkeyPatch):
    # Recorded, not run (no GPU needed): a group bound with device_id knows its GPU, so barrier() (in shutdown()
    # and after a checkpoint load) neither guesses the device nor warns about guessing, and NCCL connects at once.
    _torchrun_env(monkeypatch)
    calls: list[tuple[str, dict]] = []
    monkeypatch.setattr(environment, "_attempt_store", lambda rank, world, timeout: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", {"device": d})))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    init_distributed(device="cuda:3", rank_zero_logging=False)
    assert calls[0] == ("set_device", {"device": torch.device("cuda", 3)})
    backend, kwargs = calls[1]
    assert backend == "nccl" and kwargs["device_id"] == torch.device("cuda", 3)
    calls.clear()
    init_distributed(device="cpu", rank_zero_logging=False)
    assert [(b, "device_id" in kw) for b, kw in calls] == [("gloo", False)]


def test_shutdown_lets_a_garbage_ddp_model_go_before_it_ends_the_group(monkeypatch: pytest.MonkeyPatch):
    # A DDP model in a reference cycle outlives its training function until a collection. Collected after
    # destroy_process_group, its reducer drops the group's last reference and gloo's destructor runs holding the GIL:
    # a worker freeing a finished all-reduce's tensors then waits for that GIL forever (a hang seen 1 run in ~10 of
    # tests/unit/accelerate/test_ddp.py under load). shutdown() collects first; the reducer is gone by the time the
    # group ends.
    _torchrun_env(monkeypatch)
    init_distributed(device="cpu", rank_zero_logging=False)
    try:
        import weakref

        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        model.cycle = [model]  # type: ignore[attr-defined]  # garbage only to a collection, like an FSDP or Lightning model
        model(torch.randn(3, 4)).sum().backward()
        model_ref = weakref.ref(model)
        del model
        alive_when_ended = []
        destroy = dist.destroy_process_group
        monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: (alive_when_ended.append(model_ref() is not None), destroy(*a, **k))[1])
    finally:
        shutdown()
    assert alive_when_ended == [False]
    assert not dist.is_initialized()
