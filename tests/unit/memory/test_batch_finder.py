"""find_max_batch_size: the search, recovery after an OOM, decorator forms, and rank agreement (2 gloo processes)."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ampkit import Engine
from ampkit.memory._batch_finder import BatchSizeNotFoundError, find_max_batch_size
from ampkit.memory._oom import MemoryBudget


def _budget_trial(budget: int, per_sample: int, tried: list[int]):
    def trial(batch_size: int) -> None:
        tried.append(batch_size)
        with MemoryBudget(budget):
            torch.empty(batch_size * per_sample, dtype=torch.uint8)

    return trial


def test_doubles_then_bisects_to_the_exact_boundary():
    tried: list[int] = []
    found = find_max_batch_size(_budget_trial(1000, 7, tried))()
    assert found == 1000 // 7  # 142 fits (994 bytes), 143 does not (1001)
    assert tried[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # doubling until the first failure
    assert all(128 <= n <= 256 for n in tried[9:]) and len(tried) <= 9 + 8  # then bisection only


def test_limit_is_returned_when_it_fits_and_multiple_of_is_respected():
    tried: list[int] = []
    assert find_max_batch_size(_budget_trial(10**6, 1, tried), limit=100)() == 100
    assert tried[-1] == 100
    tried.clear()
    assert find_max_batch_size(_budget_trial(1000, 7, tried), start=16, multiple_of=8)() == 136
    assert all(n % 8 == 0 for n in tried)


def test_a_start_that_fails_halves_down():
    tried: list[int] = []
    assert find_max_batch_size(_budget_trial(100, 1, tried), start=1024)() == 100
    assert tried[:5] == [1024, 512, 256, 128, 64]


def test_nothing_fits_raises_with_the_fix():
    with pytest.raises(BatchSizeNotFoundError, match="recompute"):
        find_max_batch_size(_budget_trial(4, 8, []), start=4)()


def test_other_errors_propagate_at_once():
    tried: list[int] = []

    def trial(batch_size: int) -> None:
        tried.append(batch_size)
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        find_max_batch_size(trial)()
    assert tried == [1]


def test_a_failed_try_leaves_nothing_behind_before_the_next_one():
    """Tensors of a failed try (kept by its traceback's frames, even in a reference cycle) are freed first."""
    previous: list[weakref.ref] = []
    alive_at_start: list[bool] = []

    def trial(batch_size: int) -> None:
        alive_at_start.append(any(r() is not None for r in previous))
        activations = torch.zeros(batch_size, 64)
        cycle: dict = {"self": None, "t": activations}
        cycle["self"] = cycle  # only the garbage collector frees this one
        previous.append(weakref.ref(activations))
        if batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    gc.disable()  # the finder must collect cycles itself, not rely on an automatic collection
    try:
        assert find_max_batch_size(trial)() == 40
    finally:
        gc.enable()
    assert not any(alive_at_start)


def test_older_objects_sit_out_the_tries_collections_and_are_unfrozen_after():
    frozen_in_try: list[int] = []

    def trial(batch_size: int) -> None:
        frozen_in_try.append(gc.get_freeze_count())
        if batch_size > 4:
            raise torch.OutOfMemoryError("CUDA out of memory.")

    assert gc.get_freeze_count() == 0
    assert find_max_batch_size(trial)() == 4
    assert min(frozen_in_try) > 0 and gc.get_freeze_count() == 0

    def broken(batch_size: int) -> None:
        raise ValueError("not an OOM")

    with pytest.raises(ValueError):
        find_max_batch_size(broken)()
    assert gc.get_freeze_count() == 0  # unfrozen when the search fails too

    gc.freeze()  # someone else's freeze: kept as it was
    try:
        before = gc.get_freeze_count()
        assert find_max_batch_size(trial)() == 4
        # Still frozen. Not "== before": a frozen object another thread frees meanwhile leaves the count (an xdist
        # worker's message thread did, by 2 of 659,805).
        assert 0.99 * before <= gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_decorator_forms_and_trial_arguments():
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
    params = list(model.parameters())

    @find_max_batch_size
    def bare(batch_size: int, net: nn.Module, width: int) -> None:
        with MemoryBudget(2 * 2**20, params):
            net(torch.randn(batch_size, width)).sum().backward()
        net.zero_grad(set_to_none=True)

    @find_max_batch_size(limit=64)
    def capped(batch_size: int, net: nn.Module, width: int) -> None:
        bare.__wrapped__(batch_size, net, width)

    found = bare(model, width=32)
    assert capped(model, 32) == 64 < found
    # The control: the answer fits and the next size does not.
    bare.__wrapped__(found, model, 32)
    with pytest.raises(torch.OutOfMemoryError):
        bare.__wrapped__(found + 1, model, 32)


def test_a_real_training_step_through_the_engine(device: torch.device, mixed_policy: str):
    """Two engine steps per try (the second holds Adam's state); the answer is checked against direct runs.

    MemoryBudget counts the live bytes of the device's tensors (test_oom.py runs the search against CUDA's own limit).
    """
    torch.manual_seed(0)

    def trial(batch_size: int) -> None:
        model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 10)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine = Engine(mixed_policy)
        model, opt = engine.setup(model, opt)
        g = torch.Generator().manual_seed(batch_size)  # drawn on the CPU: every device sees the same values
        with MemoryBudget("4MiB", list(model.parameters())):
            for _ in range(2):
                x, y = torch.randn(batch_size, 64, generator=g).to(device), torch.randint(0, 10, (batch_size,), generator=g).to(device)
                with engine.autocast():
                    loss = nn.functional.cross_entropy(model(x).float(), y)
                engine.backward(loss)
                engine.step()

    found = find_max_batch_size(trial, multiple_of=8)()
    assert found >= 8
    trial(found)
    with pytest.raises(torch.OutOfMemoryError):
        trial(found + 8)


@pytest.mark.parametrize("bad", [{"limit": 0}, {"multiple_of": 0}, {"start": 12, "multiple_of": 8}, {"start": 64, "limit": 32}, {"start": True}])
def test_bad_arguments_name_the_fix(bad):
    with pytest.raises(ValueError, match="find_max_batch_size"):
        find_max_batch_size(**bad)


def test_not_callable_is_refused():
    with pytest.raises(TypeError, match="trial function"):
        find_max_batch_size(3)  # type: ignore[arg-type]


def _rank_main(rank: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        budget = 1000 if rank == 0 else 600  # rank 1 has the smaller device: its limit must win on both

        def trial(batch_size: int) -> None:
            with MemoryBudget(budget):
                torch.empty(batch_size * 4, dtype=torch.uint8)

        found = find_max_batch_size(trial)()
        with open(f"{out_file}.{rank}", "w") as f:
            f.write(str(found))
        dist.barrier()  # neither rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_the_smallest_device(tmp_path):
    out = str(tmp_path / "found")
    mp.start_processes(_rank_main, args=(str(tmp_path / "init"), out), nprocs=2, join=True, start_method="forkserver")  # tests/conftest.py preloads it
    answers = [int((tmp_path / f"found.{r}").read_text()) for r in range(2)]
    assert answers == [150, 150]
    assert not os.path.exists(f"{out}.2")
