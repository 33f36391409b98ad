"""bench_model: the Python side of ``ampkit bench --model --data``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.bench import bench_model


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def test_a_bad_tolerance_is_refused_as_the_cli_refuses_it() -> None:
    from ampkit.bench import BenchData

    data = BenchData(train=batches(3), eval=batches(1))
    with pytest.raises(ValueError, match="tolerance"):
        bench_model(nn.Linear(8, 3), data, "bf16", steps=3, warmup=1, rounds=1, device="cpu", tolerance=-0.5)


def test_the_tolerance_decides_within() -> None:
    from ampkit.bench import BenchData

    data = BenchData(train=batches(4), eval=batches(1))  # one eval batch: no eval noise, the tolerance alone decides
    strict = bench_model(nn.Linear(8, 3), data, "bf16", steps=4, warmup=1, rounds=1, device="cpu", tolerance=0.0)
    loose = bench_model(nn.Linear(8, 3), data, "bf16", steps=4, warmup=1, rounds=1, device="cpu", tolerance=10.0)
    ref, run = strict.runs
    assert run.eval_metric != ref.eval_metric  # bf16 lands elsewhere: 0 tolerance excludes it if it is worse, never if better
    assert run.within_tolerance is (run.eval_metric < ref.eval_metric)  # eval loss: lower is better
    assert loose.runs[1].within_tolerance is True


def test_accumulate_reads_that_many_batches_per_step_and_clip_none_turns_clipping_off() -> None:
    seen: list[int] = []

    def stream():  # an iterable read once: how many batches bench_model takes from it
        for i, b in enumerate(batches(20)):
            seen.append(i)
            yield b

    result = bench_model(nn.Linear(8, 3), stream(), "32-true", steps=4, warmup=1, rounds=1, device="cpu", accumulate=2, clip_grad_norm=None)
    assert len(seen) == 8 and len(result.runs[0].losses) == 4
    assert result.settings["accumulate"] == 2 and result.settings["step_items"] == 32 and result.settings["clip_grad_norm"] is None


@pytest.mark.parametrize(("kwargs", "message"), [({"accumulate": 0}, r"bench_model\(accumulate=...\) 0"), ({"clip_grad_norm": 0.0}, "--clip none"),
                                                  ({"compile": "everything"}, "compile='regional'")])
def test_a_recipe_that_cannot_run_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bench_model(nn.Linear(8, 3), batches(4), "32-true", steps=3, warmup=1, rounds=1, device="cpu", **kwargs)  # type: ignore[arg-type]


def test_policy_objects_are_taken_as_given_beside_names() -> None:
    from ampkit.policy import BF16Mixed

    toy = BF16Mixed(name="toy-bf16-mixed")  # no registered name: only the object itself can run it
    result = bench_model(nn.Linear(8, 3), batches(3), ["bf16", toy], steps=3, warmup=1, rounds=1, device="cpu")
    assert [(r.precision, r.status) for r in result.runs] == [("32-true", "ok"), ("bf16-mixed", "ok"), ("toy-bf16-mixed", "ok")]
    assert result.run("toy-bf16-mixed").losses == result.run("bf16-mixed").losses  # control: the same policy by name
