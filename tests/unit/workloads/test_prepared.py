"""A model ``accelerate.Accelerator.prepare()`` returned: every tool's Python API takes it, unwrapped to the plain fp32
module (one INFO line), and the user's prepared model keeps its autocast forward."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from ampkit.workloads._prepared import unwrap_optimizer, unwrap_prepared

accelerate = pytest.importorskip("accelerate", reason="Requires: accelerate (pip install -e '.[hf]')")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _batches(n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


@pytest.fixture
def prepared() -> Iterator[tuple[nn.Module, nn.Module, Any, torch.optim.Optimizer]]:
    """(the plain model, what prepare() returned for it under bf16 mixed precision, the prepared optimizer, the plain one)."""
    from accelerate.state import AcceleratorState

    plain = _model()
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    model, prepared_optimizer = accelerate.Accelerator(cpu=True, mixed_precision="bf16").prepare(plain, optimizer)
    yield plain, model, prepared_optimizer, optimizer
    AcceleratorState._reset_state(reset_partial_state=True)  # Accelerate's process-wide state: the next test starts afresh


def test_the_unwrapped_module_runs_in_fp32_and_the_users_model_still_autocasts(prepared: Any, caplog: pytest.LogCaptureFixture) -> None:
    plain, model, _, _ = prepared
    assert "_original_forward" in vars(model)  # what prepare() did under mixed precision: an autocast forward
    with caplog.at_level(logging.INFO, logger="ampkit"):
        inner = unwrap_prepared(model, "bench_model()")
    x = _batches(1)[0][0]
    with torch.no_grad():
        assert torch.equal(inner(x), nn.Sequential.forward(plain, x))  # fp32 all through: the class's own forward
        inner.register_forward_hook(lambda m, i, out: out)  # hooks a tool adds reach it (the call goes through __call__)
    assert "forward" not in vars(inner) and inner[0].weight is plain[0].weight  # its own forward; the same weights
    assert "_original_forward" in vars(model) and "forward" in vars(model)  # the user's prepared model is as it was
    (line,) = [r for r in caplog.records if "Accelerator.prepare()" in r.getMessage()]
    assert line.levelno == logging.INFO and "bench_model(): unwrapped the model" in line.getMessage()


def test_a_model_prepare_did_not_wrap_comes_back_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    with caplog.at_level(logging.INFO, logger="ampkit"):
        assert unwrap_prepared(model) is model and unwrap_prepared("not a module") == "not a module"
    assert not caplog.records


def test_the_accelerated_optimizer_gives_the_torch_one_inside(prepared: Any) -> None:
    _, _, prepared_optimizer, optimizer = prepared
    assert type(prepared_optimizer).__name__ == "AcceleratedOptimizer" and unwrap_optimizer(prepared_optimizer) is optimizer
    assert unwrap_optimizer(optimizer) is optimizer


def test_bench_model_on_a_prepared_model_trains_as_on_the_plain_one(prepared: Any) -> None:
    from ampkit.bench import bench_model

    _, model, _, _ = prepared
    got = bench_model(model, _batches(), "32-true", steps=4, warmup=1, rounds=1, device="cpu")
    control = bench_model(_model(), _batches(), "32-true", steps=4, warmup=1, rounds=1, device="cpu")
    assert got.runs[0].losses == control.runs[0].losses  # not the Accelerator's bf16: each policy's own precision


def test_memory_estimate_and_measure_take_a_prepared_model_and_its_optimizer(prepared: Any) -> None:
    from ampkit.memory import estimate, measure

    _, model, prepared_optimizer, _ = prepared
    batch = _batches(1)[0]
    got = estimate(model, batch, prepared_optimizer, policy="bf16-mixed")
    control = estimate(_model(), batch, lambda p: torch.optim.SGD(p, lr=0.1), policy="bf16-mixed")
    assert got.to_dict() == control.to_dict()
    assert measure(model, batch, prepared_optimizer, policy="32-true").total == estimate(_model(), batch, None, policy="32-true").total


def test_diagnose_tune_and_profile_take_a_prepared_model(prepared: Any) -> None:
    from ampkit.numerics import diagnose
    from ampkit.profile import profile_workload
    from ampkit.tuning import tune
    from ampkit.workloads import Workload

    _, model, prepared_optimizer, _ = prepared
    diagnosis = diagnose(model, _batches(), steps=2, update_steps=0, fp8_recipe=None, target="bf16-mixed")
    control = diagnose(_model(), _batches(), steps=2, update_steps=0, fp8_recipe=None, target="bf16-mixed")
    assert diagnosis.to_dict()["modules"] == control.to_dict()["modules"]
    result = tune(model, _batches(), optimizer=prepared_optimizer, device="cpu", budget=60, guard_steps=4, stages=["precision"], precisions=["bf16-mixed"])
    assert result.winner is not None
    workload = Workload(name="prepared", model=model, train_batches=_batches(), items_per_batch=8, steps=4, warmup=1)
    profile = profile_workload(workload, "32-true", "cpu", warmup=1, plain_steps=1, timed=2, sync_steps=1, trace_steps=0, trials=False)
    assert profile["steps"] == 2


def test_a_ddp_container_is_peeled_to_the_module_inside(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        plain = _model()
        with caplog.at_level(logging.INFO, logger="ampkit"):
            assert unwrap_prepared(nn.parallel.DistributedDataParallel(plain), "estimate()") is plain
    finally:
        dist.destroy_process_group()
    assert any("(DistributedDataParallel) to the plain Sequential" in r.getMessage() for r in caplog.records)
