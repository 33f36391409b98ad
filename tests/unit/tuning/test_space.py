"""The search space: what each stage varies, the keys trials are stored under, the global batch kept."""

from __future__ import annotations

import dataclasses

import pytest

from ampkit.tuning import STAGES, Candidate
from ampkit.tuning._space import Facts, PolicyFacts, micro_batches, stage_candidates

START = Candidate(policy="32-true", micro_batch=12, accumulate=1)


def _facts(**kw: object) -> Facts:
    policies = {
        "32-true": PolicyFacts(True, True, "runs everywhere"),
        "bf16-mixed": PolicyFacts(True, True, "AMX"),
        "bf16-true-masters": PolicyFacts(True, True, "AMX", masters=True),
    }
    return Facts(**{"device": "cpu", "rows": 12, "policies": policies, "cores": 4, "threads": 4, **kw})  # type: ignore[arg-type]


def test_every_candidate_keeps_the_users_global_batch() -> None:
    facts = _facts(loader_variants=[{"num_workers": 2}])
    for stage in STAGES:
        for c in stage_candidates(stage, START, facts):
            assert c.micro_batch * c.accumulate == START.micro_batch * START.accumulate, (stage, c)


def test_each_stage_changes_one_lever_of_the_incumbent() -> None:
    facts = _facts(loader_variants=[{"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}])
    assert [c.policy for c in stage_candidates("precision", START, facts)] == ["bf16-mixed", "bf16-true-masters"]
    assert [c.compile for c in stage_candidates("compile", START, facts)] == ["regional", "model"]
    assert [(c.micro_batch, c.accumulate) for c in stage_candidates("micro_batch", START, facts)] == [(6, 2)]
    assert [c.threads for c in stage_candidates("threads", START, facts)] == [1, 2]  # 4, the process's, is the incumbent's
    assert [dict(c.loader) for c in stage_candidates("loader", START, facts)] == [{"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}]
    fit = stage_candidates("fit", START, facts)
    assert fit[0] == dataclasses.replace(START, recompute=True)
    assert {(c.micro_batch, c.recompute) for c in fit[1:]} == {(m, r) for m in (6, 4, 3, 2, 1) for r in (False, True)}


def test_the_fused_step_is_tried_only_for_an_eager_policy_with_masters() -> None:
    facts = _facts()
    masters = dataclasses.replace(START, policy="bf16-true-masters")
    assert stage_candidates("fused_step", masters, facts) == [dataclasses.replace(masters, fused_step=True)]
    assert stage_candidates("fused_step", dataclasses.replace(START, policy="bf16-mixed"), facts) == []
    assert stage_candidates("fused_step", dataclasses.replace(masters, compile="model"), facts) == []  # fused by default there


def test_threads_are_a_cpu_lever_only() -> None:
    assert stage_candidates("threads", START, _facts(device="cuda")) == []


def test_an_unknown_stage_is_refused_with_the_stages() -> None:
    with pytest.raises(ValueError, match="the stages are fit, loader, channels_last, precision"):
        stage_candidates("batch", START, _facts())


def test_keys_are_stable_and_round_trip_and_numerics_ignore_speed_only_levers() -> None:
    c = Candidate(policy="bf16-mixed", micro_batch=6, accumulate=2, compile="regional", threads=2, loader=(("num_workers", 2),))
    assert c.key == "bf16-mixed mb6x2 compile=regional threads=2 num_workers=2"
    assert Candidate.from_dict(c.to_dict()) == c
    assert c.numerics_key == "bf16-mixed mb6x2 compile=regional"
    assert c.describe(START) == "precision bf16-mixed, compile regional, micro-batch 6 x 2, 2 threads, num_workers=2"
    assert START.describe(START) == "as given"


def test_micro_batches_are_the_even_splits_largest_first() -> None:
    assert micro_batches(8) == [8, 4, 2, 1]
    assert micro_batches(7) == [7, 1]


def test_channels_last_is_tried_on_an_incumbent_in_the_default_layout_only() -> None:
    facts = _facts(convs=2)
    assert stage_candidates("channels_last", START, facts) == [dataclasses.replace(START, channels_last=True)]
    already = dataclasses.replace(START, channels_last=True)
    assert stage_candidates("channels_last", already, facts) == []
    assert already.key == f"{START.key} channels_last" and already.describe(START) == "channels_last"
    assert Candidate.from_dict(already.to_dict()) == already
    assert Candidate.from_dict({k: v for k, v in START.to_dict().items() if k != "channels_last"}) == START  # stored before the lever
    assert already.numerics_key != START.numerics_key  # the guard judges the layout: its kernels sum in another order
