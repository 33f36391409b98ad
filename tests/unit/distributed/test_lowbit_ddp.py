"""bf16-true-kahan and bf16-true-sr under DDP and FSDP, on ranks whose global random streams differ (as in scripts
that seed by rank). Kahan summation is deterministic and keeps the replicas equal. Stochastic rounding draws random
bits: the engine gives it one stream that every replica shares (:mod:`ampkit.training._rounding_stream`), so the
replicas stay bitwise equal and match the single-process run; under FSDP each rank rounds its own shard with bits
of its own. Without that stream, torchao's optimizer alone lets the replicas drift apart (the last test)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine

pytest.importorskip("optimi", reason="Requires: torch-optimi (pip install -e '.[lowbit]')")

REGION = {"backend": "aot_eager"}  # the compiled step without inductor's compile time; the stream is the same either way


def _model(rank: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(8, 1, bias=False).to(device)  # one shape: torchao compiles its step per shape
    torch.manual_seed(100 + rank)  # each rank its own random stream from here on
    return model


def _train(model: nn.Module, engine: Engine, rank: int, device: torch.device, same_rows: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(2, 4, 8, generator=g)[0 if same_rows else rank].to(device)  # this rank's rows
        engine.backward(model(x).float().pow(2).mean())
        engine.step()
    return [p.detach().clone() for p in engine.models[0].parameters()]


def _kahan(rank: int, device: torch.device) -> list[torch.Tensor]:
    engine = Engine("bf16-true-kahan", strategy="ddp")
    model = _model(rank, device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    return _train(model, engine, rank, device)


@pytest.mark.slow
def test_kahan_replicas_stay_equal(run_ranks) -> None:
    results = run_ranks(_kahan)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def _sr(rank: int, device: torch.device, same_rows: bool) -> dict:
    engine = Engine("bf16-true-sr", strategy="ddp" if dist.get_world_size() > 1 else None, fused_step=REGION)
    model = _model(rank, device)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    return {"params": _train(model, engine, rank, device, same_rows), "seed": torch.tensor(torch.initial_seed())}


@pytest.mark.slow
def test_stochastic_rounding_replicas_stay_bitwise_equal_on_ranks_seeded_apart(run_ranks, device) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    results = run_ranks(_sr, False)
    start = _model(0, device).weight.detach().bfloat16()
    assert not torch.equal(results[0]["params"][0], start)  # the rounding moved the weights
    for other in results[1:]:
        assert int(other["seed"]) != int(results[0]["seed"])  # the ranks' own streams differ...
        assert all(torch.equal(a, b) for a, b in zip(results[0]["params"], other["params"], strict=True))  # ...the rounding's do not


@pytest.mark.slow
def test_stochastic_rounding_on_ranks_with_the_same_rows_is_the_single_process_run(run_ranks, device) -> None:
    # Every rank trains the same rows: DDP's average of equal gradients is exact, so only the rounding could differ.
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    ranks = run_ranks(_sr, True)
    engine = Engine("bf16-true-sr", fused_step=REGION)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = _model(0, device)  # rank 0's seeds: the rounding's stream comes from rank 0
        model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        single = _train(model, engine, 0, device, same_rows=True)
    for result in ranks:
        assert all(torch.equal(a, b) for a, b in zip(result["params"], single, strict=True))


def _sr_fsdp(rank: int, device: torch.device) -> dict:
    # Every weight starts at 0.5 and every row gets the same gradient (the loss is the outputs' sum), so the rows of
    # rank 0's shard and of rank 1's would come out bitwise equal if both ranks drew the same bits.
    torch.manual_seed(100 + rank)
    model = nn.Linear(32, 8, bias=False).to(device)
    with torch.no_grad():
        model.weight.fill_(0.5)
    engine = Engine("bf16-true-sr", strategy="fsdp", fused_step=REGION)
    model, _ = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        engine.backward(model(torch.randn(4, 32, generator=g).to(device, torch.bfloat16)).float().sum())
        engine.step()
    weight = engine.models[0].weight
    region = engine.library_step
    compiled = torch.tensor(region is not None and region.failed is None and region.calls == 1)  # the second step
    return {"local": weight.to_local().detach().clone(), "full": weight.full_tensor().detach().clone(), "compiled": compiled}


@pytest.mark.slow
def test_under_fsdp_each_rank_rounds_its_own_shard_with_its_own_bits(run_ranks, world, fsdp_trains_correctly) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    if world < 2:
        pytest.skip("Requires: 2 ranks (the CPU pass's gloo ranks)")
    results = run_ranks(_sr_fsdp)
    assert all(bool(r["compiled"]) for r in results)  # the shards stepped through the compiled region
    local = [r["local"] for r in results]
    assert local[0].shape == local[1].shape == (4, 32)  # each rank holds half the rows
    assert torch.equal(results[0]["full"], results[1]["full"]) and torch.equal(results[0]["full"], torch.cat(local))
    moved = local[0] != 0.5
    assert moved.any() and not moved.all()  # rounded at random: some weights moved, some stayed
    assert not torch.equal(local[0], local[1])  # the same values and gradients, rounded with other bits


def _sr_without_the_engine(rank: int, device: torch.device) -> list[torch.Tensor]:
    from torchao.optim import _AdamW

    model = _model(rank, device).bfloat16()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = _AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, bf16_stochastic_round=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(2, 4, 8, generator=g)[rank].to(device).bfloat16()
        ddp(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow
def test_why_the_engine_shares_the_stream_torchao_alone_lets_the_replicas_drift_apart(run_ranks, world) -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[lowbit]')")
    if world < 2:
        pytest.skip("Requires: 2 ranks (the CPU pass's gloo ranks)")
    results = run_ranks(_sr_without_the_engine)
    assert not all(torch.equal(a, b) for a, b in zip(results[0], results[1], strict=True))
