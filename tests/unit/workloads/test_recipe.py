"""The recipe rules every tool applies to a workload: micro-batches per step, the clip, the learning rate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.workloads import Workload
from ampkit.workloads._recipe import check_accumulate, check_recipe, with_lr


def _workload(**fields: object) -> Workload:
    batches = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    return Workload(name="toy", model=nn.Linear(3, 2), train_batches=batches, items_per_batch=4, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"accumulate": 0}, "accumulate (--accumulate) 0: gradient accumulation takes an int >= 1"),
        ({"accumulate": True}, "int >= 1"),
        ({"clip_grad_norm": 0.0}, "clip_grad_norm (--clip) 0.0: the gradient-norm clip must be a positive finite number, or None (--clip none)"),
        ({"clip_grad_norm": float("nan")}, "positive finite"),
        ({"lr": -1.0}, "--lr"),
    ],
)
def test_a_recipe_the_engine_cannot_run_is_refused_naming_the_option(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_recipe(_workload(**fields))


def test_a_recipe_the_engine_runs_passes_and_accumulate_comes_back() -> None:
    check_recipe(_workload(accumulate=4, clip_grad_norm=None, lr=1e-4))
    assert check_accumulate(3) == 3
    with pytest.raises(ValueError, match=r"^bench_model\(accumulate=...\) 2.5: "):
        check_accumulate(2.5, "bench_model(accumulate=...)")


def test_with_lr_sets_every_group_and_none_leaves_the_optimizers_own() -> None:
    head, body = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": head.parameters(), "lr": 0.5}, {"params": body.parameters()}], lr=0.1)
    assert [g["lr"] for g in with_lr(opt, None).param_groups] == [0.5, 0.1]
    assert [g["lr"] for g in with_lr(opt, 1e-3).param_groups] == [1e-3, 1e-3]
