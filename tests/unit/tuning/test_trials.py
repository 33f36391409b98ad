"""Trials: each lever trains what it says (checked against the plain run), intervals and compile amortisation are
the bench's."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch
from torch import nn

from ampkit.bench import speedup_interval
from ampkit.memory import recomputed_modules
from ampkit.tuning import Candidate, Trial
from ampkit.tuning._trials import make_run, micro_workload, threads
from ampkit.workloads import Workload

ROWS = 8  # the mlp fixture's rows (tests/unit/tuning/conftest.py)


def _trained(workload: Workload, c: Candidate, device: torch.device, steps: int = 3) -> nn.Module:
    run = make_run(workload, c, device, seed=0, steps=steps)
    run.build()
    run.train(steps, False)
    assert run.model is not None
    return run.model


def test_micro_batches_with_accumulation_train_the_global_batch(mlp: Workload, device: torch.device) -> None:
    # The control: the user's batch in one piece. Two micro-batches of half the rows, accumulated, make the same
    # update (the mean loss over the same rows), up to rounding: the weights after three steps agree.
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    whole = _trained(w, start, device)
    halves = _trained(w, dataclasses.replace(start, micro_batch=ROWS // 2, accumulate=2), device)
    for a, b in zip(whole.parameters(), halves.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_micro_workload_keeps_the_rows_and_their_order(mlp: Workload) -> None:
    w = mlp
    m = micro_workload(w, Candidate(policy="32-true", micro_batch=2, accumulate=4))
    assert (len(m.train_batches), m.items_per_batch, m.accumulate) == (12, 2, 4)
    assert torch.equal(torch.cat([x for x, _ in m.train_batches[:4]]), w.train_batches[0][0])
    with pytest.raises(ValueError, match="micro-batches must split each batch evenly"):
        micro_workload(w, Candidate(policy="32-true", micro_batch=3, accumulate=3))


def test_recompute_checkpoints_the_copys_blocks_and_changes_no_number(mlp: Workload, device: torch.device) -> None:
    w = mlp
    start = Candidate(policy="32-true", micro_batch=ROWS, accumulate=1)
    plain, recomputed = _trained(w, start, device), _trained(w, dataclasses.replace(start, recompute=True), device)
    assert recomputed_modules(recomputed) == ["0", "1"] and not recomputed_modules(w.model)
    for a, b in zip(plain.parameters(), recomputed.parameters()):
        assert torch.equal(a, b)


def test_threads_are_set_around_the_block_and_put_back() -> None:
    before = torch.get_num_threads()
    with threads(1):
        assert torch.get_num_threads() == 1
    with threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before


def test_a_trials_speedup_amortises_its_compile_time_over_the_run() -> None:
    base = [0.020, 0.021, 0.019, 0.020, 0.022, 0.020]
    fast = [t / 2 for t in base]
    t = Trial(key="c", stage="compile", candidate={}, step_times_s=fast, baseline_times_s=base, compile_s=5.0)
    assert t.amortised_s(100) == pytest.approx(statistics.median(fast) + 0.05)
    assert t.speedup(100) == pytest.approx(statistics.median(base) / (statistics.median(fast) + 0.05))
    assert t.speedup(10**9) == pytest.approx(2.0)
    assert t.interval(100) == speedup_interval(base, [x + 0.05 for x in fast])  # the bench's bootstrap, shifted
    assert t.interval(100)[1] < 1.0 < t.interval(10**9)[0]  # slower over 100 steps, faster over a long run


def test_an_fp8_trial_converts_the_layers_its_roofline_plans_at_the_micro_batchs_rows() -> None:
    # As ampkit bench runs fp8: the policy set to the plan made at the batch's own rows (the control: the plan).
    from ampkit.memory import fp8_layer_plan
    from ampkit.tuning._trials import trial_policy

    big = nn.Sequential(nn.Linear(4096, 4096), nn.Linear(4096, 16))
    w = Workload(name="big", model=big, train_batches=[(torch.zeros(8192, 4096), torch.zeros(8192, dtype=torch.long))],
                 items_per_batch=8192, steps=2, warmup=1)
    plan = fp8_layer_plan(big, w.train_batches[0], "fp8-tensorwise")
    policy = trial_policy(w, "fp8-tensorwise")
    assert policy.layers.names == frozenset(p.name for p in plan.layers if p.convert) == {"0"}  # type: ignore[attr-defined]
    assert trial_policy(w, "bf16-mixed").name == "bf16-mixed"


def test_the_doctors_fix_runs_its_modules_in_fp32_in_the_trial() -> None:
    # 16-mixed with the head kept in fp32 (the doctor's fix): the trial's engine gets that policy, and the head's
    # output comes out fp32 where the rest of the forward is fp16.
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3))
    w = Workload(name="mlp", model=model, train_batches=[(torch.randn(4, 8), torch.randint(0, 3, (4,)))], items_per_batch=4, steps=2, warmup=1)
    c = Candidate(policy="16-mixed", micro_batch=4, accumulate=1, keep_fp32=("1",))
    run = make_run(w, c, torch.device("cpu"), seed=0, steps=1)
    assert run.policy.name == "16-mixed" and run.policy.keep_fp32 == ("1",)
    seen = {}
    run.build()
    for name in ("0", "1"):
        run.model.get_submodule(name).register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.dtype))
    run.train(1, False)
    run.release()
    assert seen == {"0": torch.float16, "1": torch.float32}


def test_channels_last_converts_the_copy_and_the_images_and_trains_as_the_default_layout(device: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    images = [(torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(2)]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).to(device)
    w = Workload(name="conv", model=model, train_batches=images, items_per_batch=4, steps=2, warmup=1)
    start = Candidate(policy="32-true", micro_batch=4, accumulate=1)
    nhwc = make_run(w, dataclasses.replace(start, channels_last=True), device, seed=0, steps=2)
    assert all(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() for x, _ in nhwc.batches)
    control = make_run(w, start, device, seed=0, steps=2)
    assert all(x.is_contiguous() for x, _ in control.batches)
    a, b = _trained(w, start, device, steps=2), _trained(w, dataclasses.replace(start, channels_last=True), device, steps=2)
    assert b[0].weight.is_contiguous(memory_format=torch.channels_last) and not b[0].weight.is_contiguous()
    assert not model[0].weight.is_contiguous(memory_format=torch.channels_last)  # the user's model is left as given
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)  # the same training, another summation order
