"""Out-of-memory errors on the device: recognised, their memory freed, and training recovered from a real CUDA OOM.

On CUDA the limit is real: ``torch.cuda.set_per_process_memory_fraction`` lets the caching allocator reserve only
a given headroom above what it holds, so a too-large batch raises ``torch.OutOfMemoryError`` from the allocator
itself. The CPU has no such limit (an allocation fails only after the machine swaps): there the same recovery paths
run under :class:`~ampkit.memory._oom.MemoryBudget`, in training/test_micro_batching.py and memory/test_batch_finder.py.
"""

from __future__ import annotations

import contextlib
import copy
import gc
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from ampkit import Engine
from ampkit.memory import find_max_batch_size, is_out_of_memory, release_memory

MiB = 2**20
NO_FRACTION_ON_CPU = (
    "needs the CUDA caching allocator's per-process memory fraction to provoke a real OOM; the CPU runs the same "
    "recovery under MemoryBudget (training/test_micro_batching.py, memory/test_batch_finder.py)"
)


@contextlib.contextmanager
def cuda_headroom(device: torch.device, extra: int) -> Iterator[None]:
    """Let the caching allocator reserve at most ``extra`` bytes above what it holds now; restored on exit."""
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + extra) / total, device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "CUDA error: out of memory",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes.",
    ],
)
def test_allocation_failures_of_cuda_libraries_count_as_out_of_memory(message: str):
    assert is_out_of_memory(RuntimeError(message))
    assert not is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`"))


def test_a_real_oom_is_recognised_and_release_memory_frees_the_failed_attempt(device: torch.device):
    if device.type != "cuda":
        pytest.skip(NO_FRACTION_ON_CPU)
    base = torch.cuda.memory_allocated(device)

    def attempt() -> torch.Tensor:
        partial = torch.empty(128 * MiB, dtype=torch.uint8, device=device)  # kept alive by this frame in the traceback
        return partial + torch.empty(512 * MiB, dtype=torch.uint8, device=device)

    failure: BaseException | None = None
    with cuda_headroom(device, 256 * MiB):
        try:
            attempt()
        except Exception as exc:  # noqa: BLE001 - the test inspects what was raised
            failure = exc
        assert isinstance(failure, torch.OutOfMemoryError) and is_out_of_memory(failure)
        assert torch.cuda.memory_allocated(device) == base + 128 * MiB  # the traceback still holds `partial`
        release_memory(failure)
        del failure
        assert torch.cuda.memory_allocated(device) == base
        # The allocator is whole after the failure: the full headroom can be taken again.
        again = torch.empty(224 * MiB, dtype=torch.uint8, device=device)
        del again
    assert torch.cuda.memory_allocated(device) == base


def _wide_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 10)).to(device)


def test_a_step_that_runs_out_of_cuda_memory_is_split_and_matches_the_unsplit_step(device: torch.device, mixed_policy: str):
    """Control: the same weights and batch stepped unsplit without a limit. The split step must give the same update,
    the same optimizer state and scale, and hold exactly the memory the control holds after its step."""
    if device.type != "cuda":
        pytest.skip(NO_FRACTION_ON_CPU)
    n = 8192  # in 16-mixed the unsplit step needs ~280 MiB of activations and gradients, a quarter of it fits 160 MiB
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(n, 1024, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device))
    start = [p.detach().cpu() for p in _wide_model(torch.device("cpu")).parameters()]

    def run(headroom: int | None) -> tuple[Engine, list[torch.Tensor], list[torch.Tensor], float, int]:
        base = torch.cuda.memory_allocated(device)
        model = _wide_model(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        engine = Engine(mixed_policy)
        model, opt = engine.setup(model, opt)
        loss_fn = lambda b: nn.functional.cross_entropy(model(b[0]).float(), b[1])
        with cuda_headroom(device, headroom) if headroom else contextlib.nullcontext():
            loss = engine.train_step(loss_fn, batch)
        gc.collect()
        held = torch.cuda.memory_allocated(device) - base
        updates = [(p.detach().cpu() - s) for p, s in zip(model.parameters(), start, strict=True)]
        # A mean loss over 8192 rows keeps the scaled fp16 gradients far from overflow: the step is taken, and SGD's
        # momentum buffers (the optimizer state) exist.
        momenta = [opt.state[p]["momentum_buffer"].cpu() for p in model.parameters()]
        return engine, updates, momenta, loss.item(), held

    # The first matmuls of a process allocate cuBLAS's and cuBLASLt's workspaces through the caching allocator, where
    # they stay: a run that paid them would hold more than the other. Warmed up, neither pays them.
    run(None)
    control, want_updates, want_momenta, want_loss, want_held = run(None)
    engine, updates, momenta, loss, held = run(160 * MiB)
    assert control.micro_batch_rows is None and engine.micro_batch_rows is not None and engine.micro_batch_rows < n
    assert engine.steps == control.steps == 1
    for got, want in zip([*updates, *momenta], [*want_updates, *want_momenta], strict=True):
        assert (got - want).norm() <= 1e-2 * want.norm()  # fp16 rounds each piece's sum differently
    assert loss == pytest.approx(want_loss, rel=1e-3)
    if control.scaler is not None:
        assert engine.scaler.state_dict() == control.scaler.state_dict()
    assert held == want_held  # nothing of the failed attempts is left on the device


def test_the_batch_finder_stops_at_a_real_cuda_limit_and_leaves_the_model_as_it_was(device: torch.device):
    if device.type != "cuda":
        pytest.skip(NO_FRACTION_ON_CPU)
    model = _wide_model(device)
    before = copy.deepcopy(model.state_dict())

    def trial(batch_size: int) -> None:
        x = torch.randn(batch_size, 1024, device=device)
        model(x).float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)

    trial(256)  # cuBLAS's workspaces, allocated at a process's first matmuls and kept, are not the trials' memory
    base = torch.cuda.memory_allocated(device)
    with cuda_headroom(device, 128 * MiB):
        found = find_max_batch_size(trial, start=256, limit=1 << 15, multiple_of=256)()
        assert torch.cuda.memory_allocated(device) == base  # every failed try was freed
        trial(found)  # the control: the answer runs, the next size does not
        release_memory()
        failure: BaseException | None = None
        try:
            trial(found + 256)
        except torch.OutOfMemoryError as exc:
            failure = exc
        assert failure is not None
        release_memory(failure)
        del failure
    assert 256 <= found < 1 << 15
    assert torch.cuda.memory_allocated(device) == base
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
