"""The engine under DDP on the pass's ranks (two gloo ranks on the CPU, one NCCL rank on CUDA), checked against a
single process on the concatenated batch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ampkit import Engine

ROWS = 16  # per rank


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5)).to(device)


def _batches(steps: int, world: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)  # drawn on the CPU: every device sees the same values
    batches = [(torch.randn(world * ROWS, 12, generator=g), torch.randint(0, 5, (world * ROWS,), generator=g)) for _ in range(steps)]
    return [(x.to(device), y.to(device)) for x, y in batches]


def _rows(batch, rank):
    x, y = batch
    return x[rank * ROWS : (rank + 1) * ROWS], y[rank * ROWS : (rank + 1) * ROWS]


def _precision(spec: str, half_dtype: torch.dtype) -> str:
    """``{half}`` in a parametrized precision is the pass's 16-bit type: fp16 (with loss scaling) on CUDA, bf16 on CPU."""
    return spec.format(half="16" if half_dtype == torch.float16 else "bf16")


def _train(model, engine, opt, batches, rank=None):
    """Steps over ``batches`` (this rank's rows when ``rank`` is given); gradients seen by each optimizer step."""
    grads = []
    opt.register_step_pre_hook(lambda o, a, k: grads.append([p.grad.detach().clone() for g in o.param_groups for p in g["params"]]))
    for batch in batches:
        x, y = _rows(batch, rank) if rank is not None else batch
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
    return grads


def _ddp_grads(rank: int, device: torch.device, precision: str) -> dict:
    torch.manual_seed(100 + rank)  # different weights per rank: setup must broadcast rank 0's
    model = nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5)).to(device)
    model.load_state_dict(_model(device).state_dict()) if rank == 0 else None
    engine = Engine(precision, strategy="ddp")
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(model, nn.parallel.DistributedDataParallel)
    grads = _train(model, engine, opt, _batches(3, dist.get_world_size(), device), rank)
    return {"grads": grads, "params": [p.detach().clone() for p in engine.models[0].parameters()]}


@pytest.mark.parametrize("spec, rtol", [("32-true", 1e-5), ("{half}-mixed", 2e-2), ("{half}-true-masters", 3e-2)], ids=["32-true", "half-mixed", "half-true-masters"])
def test_ddp_gradients_equal_the_single_process_step_on_the_concatenated_batch(run_ranks, device, world, half_dtype, spec, rtol):
    precision = _precision(spec, half_dtype)
    results = run_ranks(_ddp_grads, precision)
    for other in results[1:]:
        for a, b in zip(results[0]["params"], other["params"], strict=True):
            assert torch.equal(a, b)  # replicas never drift apart
    model = _model(device)
    engine = Engine(precision)
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    want = _train(model, engine, opt, _batches(3, world, device))
    assert len(results[0]["grads"]) == len(want) > 0
    for got_step, want_step in zip(results[0]["grads"], want, strict=True):
        for g, w in zip(got_step, want_step, strict=True):
            assert (g.float() - w.float()).norm() <= rtol * w.float().norm()


def _skip_on_one_rank(rank: int, device: torch.device) -> dict:
    model = _model(device)
    engine = Engine("16-mixed", strategy="ddp")
    model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    world = dist.get_world_size()
    out = {"scales": [], "skipped": [], "params": []}
    for step, batch in enumerate(_batches(3, world, device)):
        x, y = _rows(batch, rank)
        if step == 1 and rank == world - 1:
            x = x.clone()
            x[0, 0] = float("inf")  # an overflow on the last rank only
        with engine.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        engine.backward(loss)
        engine.step()
        out["scales"].append(torch.tensor(engine.scale))
        out["skipped"].append(torch.tensor(engine.step_was_skipped))
        out["params"].append([p.detach().clone() for p in engine.models[0].parameters()])
    return out


def test_an_inf_on_one_rank_skips_the_step_on_every_rank_with_the_same_scale(run_ranks):
    results = run_ranks(_skip_on_one_rank)
    r0 = results[0]
    for r in results:
        assert [bool(s) for s in r["skipped"]] == [False, True, False]
        assert [float(s) for s in r["scales"]] == [2.0**16, 2.0**15, 2.0**15]
    for a, b in zip(r0["params"][1], r0["params"][0], strict=True):
        assert torch.equal(a, b)  # the skipped step changed nothing
    for r in results[1:]:
        for step0, step1 in zip(r0["params"], r["params"], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(step0, step1, strict=True))


def _accumulate(rank: int, device: torch.device, through_engine_forward: bool) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = _model(device)
    engine = Engine(strategy="ddp", accumulate=4)
    model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    calls = []

    def counting(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting)
    for batch in _batches(8, dist.get_world_size(), device):
        x, y = _rows(batch, rank)
        if through_engine_forward:
            with engine.autocast():  # no_sync on the 3 micro-batches before each boundary
                loss = nn.functional.cross_entropy(model(x), y)
        else:
            loss = nn.functional.cross_entropy(model(x), y)  # syncs every micro-batch
        engine.backward(loss)
        engine.step()
    return {"calls": torch.tensor(len(calls)), "params": [p.detach().clone() for p in engine.models[0].parameters()]}


def test_accumulation_under_no_sync_equals_syncing_every_micro_batch(run_ranks):
    lazy = run_ranks(_accumulate, True)[0]
    eager = run_ranks(_accumulate, False)[0]
    assert int(eager["calls"]) == 4 * int(lazy["calls"]) > 0  # one all-reduce per optimizer step, not per micro-batch
    for a, b in zip(lazy["params"], eager["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _ddp_params(rank: int, device: torch.device, compile_spec: object) -> dict:
    model = _model(device)
    engine = Engine("bf16-mixed" if device.type == "cpu" else "16-mixed", strategy="ddp", compile=compile_spec)
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _train(model, engine, opt, _batches(3, dist.get_world_size(), device), rank)
    names = [n for n, _ in engine.named_parameters()]
    return {
        "params": [p.detach().clone() for _, p in engine.named_parameters()],
        "plain_names": torch.tensor(not any("_orig_mod" in n for n in names)),
        "compiled": torch.tensor(len(engine.compiled)),
    }


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_ddp_with_compile_matches_ddp_without(run_ranks):
    """DDP wraps the model, then the engine compiles the module inside it: gradients still all-reduce through DDP's
    hooks, so the compiled run (aot_eager: the captured graph run unfused) ends bitwise where the eager one does."""
    compiled = run_ranks(_ddp_params, {"backend": "aot_eager"})
    eager = run_ranks(_ddp_params, None)
    for c, e in zip(compiled, eager):
        assert bool(c["plain_names"]) and int(c["compiled"]) == 1 and int(e["compiled"]) == 0
        assert all(torch.equal(a, b) for a, b in zip(c["params"], e["params"]))
    assert all(torch.equal(a, b) for a, b in zip(compiled[0]["params"], compiled[-1]["params"]))  # the ranks agree


def _fused_and_unfused(rank: int, device: torch.device, _: object) -> dict:
    out = {}
    for key, fused in (("fused", {"backend": "aot_eager"}), ("unfused", False)):
        model = _model(device)
        engine = Engine("bf16-true-masters", strategy="ddp", fused_step=fused, clip_grad_norm=1.0)
        model, _opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        for batch in _batches(3, dist.get_world_size(), device):
            x, y = _rows(batch, rank)
            with engine.autocast():
                loss = nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
            engine.backward(loss)
            engine.step()
        out[key] = [m.detach().clone() for m in engine.masters.masters]
        out[f"{key}_calls"] = torch.tensor(engine.fused_step.calls if engine.fused_step is not None else 0)
    return out


def test_the_fused_master_step_under_ddp_matches_the_unfused_one(run_ranks):
    """DDP all-reduces the 16-bit gradients before the step, so the fused step needs nothing across ranks: each rank
    steps the same masters from the same gradients, and the run matches the unfused one."""
    ranks = run_ranks(_fused_and_unfused, None)
    for r in ranks:
        assert int(r["fused_calls"]) == 2  # after the unfused first step
        torch.testing.assert_close(r["fused"], r["unfused"])
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["fused"], ranks[-1]["fused"]))  # the ranks agree
