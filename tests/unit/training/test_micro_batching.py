"""Engine.train_step: out-of-memory splitting checked against an unsplit fp32 control with the same weights and data."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ampkit import Engine
from ampkit.memory._batch_finder import _older_objects_frozen as older_objects_frozen
from ampkit.memory._oom import MemoryBudget
from ampkit.training._micro_batching import MicroBatcher, batch_rows, split_batch

N, D = 256, 128


@pytest.fixture(autouse=True)
def _older_objects_frozen():
    """Every out-of-memory error ends in a full gc.collect() (ampkit.training._oom.release_memory). Late in a test
    run that walks millions of objects left by earlier tests, about 0.5 s each; frozen as the batch finder freezes
    them, they are skipped, while the garbage this test makes is still collected."""
    with older_objects_frozen():
        yield


def _model(device: torch.device | str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 512), nn.LayerNorm(512), nn.GELU(), nn.Linear(512, 10)).to(device)


def _batch(seed: int = 1, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)  # drawn on the CPU: every device sees the same values
    return torch.randn(N, D, generator=g).to(device), torch.randint(0, 10, (N,), generator=g).to(device)


def _run(model: nn.Module, batches, budget=None, precision="32-true", **engine_kw):
    """Engine steps; returns the gradients each optimizer step saw (an optimizer pre-hook copies them)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(precision, **engine_kw)
    model, opt = engine.setup(model, opt)
    grads, losses = [], []
    opt.register_step_pre_hook(lambda o, args, kwargs: grads.append([p.grad.clone() for p in model.parameters()]))
    for batch in batches:
        loss_fn = lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1])
        if budget is None:
            loss = engine.train_step(loss_fn, batch)
        else:
            with MemoryBudget(budget, [*model.parameters(), *batch]):
                loss = engine.train_step(loss_fn, batch)
        losses.append(loss)
    return engine, grads, losses


def _assert_grads_equal(got, want, rtol):
    for step_got, step_want in zip(got, want, strict=True):
        for g, w in zip(step_got, step_want, strict=True):
            assert (g - w).norm() <= rtol * w.norm(), (g - w).norm() / w.norm()


BUDGET = "1MiB"  # the unsplit step of 256 rows needs ~1.6 MiB here; 64-row passes fit


def test_split_gradients_equal_the_unsplit_step_fp32(device: torch.device):
    # MemoryBudget counts the live bytes of any device's tensors: on CUDA it drives the same splits over CUDA kernels
    # (test_oom.py provokes the allocator's own OOM). cuBLAS may sum the rows of pieces in another order than the
    # rows of the whole batch, hence the looser tolerance there.
    rtol = 1e-6 if device.type == "cpu" else 1e-5
    batches = [_batch(s, device) for s in (1, 2, 3)]
    _, want, want_loss = _run(_model(device), batches)
    engine, got, got_loss = _run(_model(device), batches, budget=BUDGET)
    assert engine.micro_batch_rows is not None and engine.micro_batch_rows < N  # it did split
    _assert_grads_equal(got, want, rtol)
    torch.testing.assert_close(torch.stack(got_loss), torch.stack(want_loss), rtol=rtol, atol=0)
    assert engine.steps == 3


def test_split_gradients_mixed_close_to_unsplit(device: torch.device, mixed_policy: str):
    batches = [_batch(1, device)]
    _, want, _ = _run(_model(device), batches, precision=mixed_policy)
    engine, got, _ = _run(_model(device), batches, budget="1250KiB", precision=mixed_policy)
    assert engine.micro_batch_rows < N
    _assert_grads_equal(got, want, 2e-2)  # 16 bits round each piece's sum differently


def test_the_smaller_size_sticks_and_is_announced_once_per_halving(caplog):
    fed: list[int] = []
    model = _model()
    engine = Engine()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))  # a step needs an optimizer to take
    x = _batch()[0]

    def loss_fn(rows):
        fed.append(rows.shape[0])
        return model(rows).pow(2).mean()

    with caplog.at_level(logging.WARNING, logger="ampkit"), MemoryBudget(BUDGET, [*model.parameters(), x]):
        engine.train_step(loss_fn, x)
        first = list(fed)
        fed.clear()
        engine.train_step(loss_fn, x)
    rows = engine.micro_batch_rows
    assert first[0] == N and fed == [rows] * (N // rows)  # the second step does not try the failed size again
    halvings = [r for r in caplog.records if "splitting into passes" in r.getMessage()]
    assert len(halvings) == (N // rows).bit_length() - 1


def test_a_failed_forward_goes_on_from_the_failed_row_and_every_row_counts_once():
    """A sum over per-row values: each row must reach a successful backward exactly once."""
    seen: list[torch.Tensor] = []
    w = nn.Parameter(torch.ones(()))
    engine = Engine()
    holder = nn.Module()
    holder.w = w
    engine.setup(holder, torch.optim.SGD([w], lr=0.0))
    idx = torch.arange(N)
    calls = {"n": 0}

    def loss_fn(rows):
        calls["n"] += 1
        if calls["n"] == 3:  # the second piece's forward fails once
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        seen.append(rows.clone())
        return (w * rows.float()).sum()

    grads = []
    w.register_hook(lambda g: grads.append(g.detach().clone()))
    engine.micro_batch_rows = 64
    loss = engine.train_step(loss_fn, idx, reduction="sum")
    assert torch.equal(torch.sort(torch.cat(seen)).values, idx)  # no row lost, none twice
    assert float(loss) == float(idx.sum()) and float(sum(grads)) == float(idx.sum())
    assert engine.micro_batch_rows == 32


def test_a_failed_backward_with_earlier_micro_batches_pending_raises_with_the_fix():
    model = _model()
    engine = Engine(accumulate=2)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = _batch()[0]
    engine.train_step(lambda r: model(r).pow(2).mean(), x)  # first micro-batch of the window: fine
    state = {"n": 0}

    def loss_fn(rows):
        out = model(rows).pow(2).mean()

        def fail(grad):
            state["n"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory.")

        out.register_hook(fail)
        return out

    with pytest.raises(torch.OutOfMemoryError, match=r"micro_batch_rows=128"):
        engine.train_step(loss_fn, x)


def test_on_oom_raise_and_other_errors_propagate_unchanged():
    model = _model()
    engine = Engine(on_oom="raise")
    model = engine.setup(model)
    x = _batch()[0]
    with pytest.raises(torch.OutOfMemoryError, match="MemoryBudget"), MemoryBudget(BUDGET, [*model.parameters(), x]):
        engine.train_step(lambda r: model(r).pow(2).mean(), x)
    engine = Engine()
    model = engine.setup(_model())
    with pytest.raises(ZeroDivisionError):
        engine.train_step(lambda r: 1 / 0, x)
    assert engine.micro_batch_rows is None


def test_micro_batch_rows_is_saved_and_restored(tmp_path):
    model = _model()
    engine = Engine(micro_batch_rows=48)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.train_step(lambda b: nn.functional.cross_entropy(model(b[0]), b[1]), _batch())
    engine.save(tmp_path / "ckpt.pt")
    restored = Engine()
    m2 = _model()
    restored.setup(m2, torch.optim.SGD(m2.parameters(), lr=0.1))
    restored.load(tmp_path / "ckpt.pt")
    assert restored.micro_batch_rows == 48


def test_preset_micro_batch_rows_equals_unsplit():
    batches = [_batch(4)]
    _, want, _ = _run(_model(), batches)
    _, got, _ = _run(_model(), batches, micro_batch_rows=100)  # pieces of 100, 100, 56: unequal weights
    _assert_grads_equal(got, want, 1e-6)


def test_batch_helpers_and_errors():
    b = {"x": torch.zeros(6, 2), "y": torch.arange(6), "t": torch.tensor(1.0), "name": "digits"}
    assert batch_rows(b) == 6
    piece = split_batch(b, 4, 6)
    assert piece["x"].shape == (2, 2) and torch.equal(piece["y"], torch.tensor([4, 5])) and piece["name"] == "digits"
    assert piece["x"].data_ptr() == b["x"][4:].data_ptr()  # a view, no copy
    with pytest.raises(ValueError, match="first dimensions differ"):
        batch_rows((torch.zeros(3), torch.zeros(4)))
    with pytest.raises(ValueError, match="no tensor"):
        batch_rows(("a", 1))
    engine = Engine()
    model = engine.setup(_model())
    with pytest.raises(TypeError, match="scalar loss"):
        engine.train_step(lambda r: model(r), _batch()[0])
    with pytest.raises(ValueError, match="reduction"):
        engine.train_step(lambda r: model(r).sum(), _batch()[0], reduction="none")
    with pytest.raises(ValueError, match="micro_batch_rows"):
        Engine(micro_batch_rows=0)
    with pytest.raises(ValueError, match="on_oom"):
        Engine(on_oom="retry")
    with pytest.raises(RuntimeError, match="setup"):
        Engine().train_step(lambda r: r.sum(), torch.zeros(2))


def _rank_main(rank: int, init_file: str, result_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        _rank_step(rank, result_dir)
        dist.barrier()
        # The DDP model went with _rank_step's frame, while the group is still registered (ampkit.distributed.shutdown
        # says why that order matters: its reducer dropping the group's last reference can hang).
        gc.collect()
    finally:
        dist.destroy_process_group()


def _rank_step(rank: int, result_dir: str) -> None:
    model = nn.parallel.DistributedDataParallel(_model())
    x, y = _batch(1)
    half = slice(rank * N // 2, (rank + 1) * N // 2)
    # Rank 1 learnt a smaller size earlier; rank 0 did not: both must run the same number of passes.
    engine = Engine(micro_batch_rows=32 if rank == 1 else None)
    model, opt = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    grads = []
    opt.register_step_pre_hook(lambda o, a, k: grads.append([p.grad.clone() for p in model.parameters()]))
    passes = []

    def loss_fn(b):
        passes.append(b[0].shape[0])
        return nn.functional.cross_entropy(model(b[0]), b[1])

    engine.train_step(loss_fn, (x[half], y[half]))
    torch.save({"passes": passes, "grads": grads[0]}, f"{result_dir}/{rank}.pt")


def test_ranks_split_alike_and_match_the_single_process_step(tmp_path):
    mp.start_processes(_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True, start_method="forkserver")  # tests/conftest.py preloads it
    r0, r1 = (torch.load(tmp_path / f"{r}.pt", weights_only=True) for r in range(2))
    assert r0["passes"] == r1["passes"] == [32, 32, 32, 32]
    _, want, _ = _run(_model(), [_batch(1)])
    _assert_grads_equal([r0["grads"]], want, 1e-6)
    _assert_grads_equal([r1["grads"]], want, 1e-6)


def test_an_oom_inside_a_distributed_step_is_raised_with_the_fix(monkeypatch):
    """The other ranks already wait in DDP's all-reduce; one rank cannot retry alone (world size faked to 2)."""
    from ampkit.training import _micro_batching as micro_batching

    monkeypatch.setattr(micro_batching, "world_size", lambda: 2)
    monkeypatch.setattr(micro_batching, "agree_min", lambda v: v)
    engine = Engine()
    model = engine.setup(_model())
    x = _batch()[0]
    with pytest.raises(torch.OutOfMemoryError, match=r"torchrun.*micro_batch_rows=128"), MemoryBudget(BUDGET, [*model.parameters(), x]):
        engine.train_step(lambda r: model(r).pow(2).mean(), x)


def _poisoned(model: nn.Module, poison: int):
    """A loss whose forward runs out of memory on any piece holding row ``poison``, however small the piece."""

    def loss_fn(rows):
        x, y, index = rows
        if bool((index == poison).any()):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return nn.functional.cross_entropy(model(x).float(), y)

    return loss_fn


def _grads_of_one_clean_window(precision: str, batches) -> list[torch.Tensor]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(precision, accumulate=len(batches), micro_batch_rows=64)
    model, opt = engine.setup(model, opt)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.extend(p.grad.float().clone() for p in o.param_groups[0]["params"]))
    for x, y in batches:
        engine.train_step(lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1]), (x, y))
    return seen


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true-masters"])
def test_an_oom_even_at_one_row_leaves_no_part_of_the_batch_in_the_gradients(precision):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(precision, micro_batch_rows=64)
    model, opt = engine.setup(model, opt)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.extend(p.grad.float().clone() for p in o.param_groups[0]["params"]))
    x, y = _batch(1)
    with pytest.raises(torch.OutOfMemoryError, match="single row.*gradients are as they were before this step"):
        engine.train_step(_poisoned(model, poison=100), (x, y, torch.arange(N)))  # rows 0-99 went through first
    assert all(p.grad is None for p in model.parameters()) and engine.steps == 0
    # A caller that catches the error and goes on: the next step sees that batch's gradients alone.
    engine.micro_batch_rows = 64  # as the control runs: the same passes give the same sums, bit for bit
    clean = _batch(2)
    engine.train_step(lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1]), clean)
    want = _grads_of_one_clean_window(precision, [clean])
    for got, expected in zip(seen, want, strict=True):
        assert torch.equal(got, expected)


def test_an_oom_at_one_row_inside_a_window_discards_the_window_and_says_so():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = Engine(accumulate=2, micro_batch_rows=64)
    model, opt = engine.setup(model, opt)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.extend(p.grad.clone() for p in o.param_groups[0]["params"]))
    loss_fn = lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1])
    engine.train_step(loss_fn, _batch(1))  # the window's first micro-batch
    x, y = _batch(2)
    with pytest.raises(torch.OutOfMemoryError, match=r"\(1 earlier micro-batch\(es\)\).*discarded.*starts a new window"):
        engine.train_step(_poisoned(model, poison=100), (x, y, torch.arange(N)))
    assert all(p.grad is None for p in model.parameters()) and engine.step_state.micro == 0
    engine.micro_batch_rows = 64
    for seed in (3, 4):
        engine.train_step(loss_fn, _batch(seed))
    assert engine.steps == 1
    for got, expected in zip(seen, _grads_of_one_clean_window("32-true", [_batch(3), _batch(4)]), strict=True):
        assert torch.equal(got, expected)


def test_a_batch_of_zero_rows_is_refused_before_it_counts_a_step():
    model = _model()
    engine = Engine()
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="0 rows.*drop_last=True"):
        engine.train_step(lambda b: model(b).sum(), torch.zeros(0, D))
    assert engine.steps == 0 and engine.step_state.micro == 0


def test_the_batcher_checks_the_rows_it_learns_and_what_an_oom_does() -> None:
    batcher = MicroBatcher(rows=32, on_oom="split")
    with pytest.raises(ValueError, match=r"micro_batch_rows must be an int >= 1 or None \(the whole batch\), got 0"):
        batcher.learn(0)
    assert batcher.rows == 32
    with pytest.raises(ValueError, match=r"on_oom='retry': pass 'split' \(retry in smaller passes\) or 'raise'"):
        MicroBatcher(rows=None, on_oom="retry")
