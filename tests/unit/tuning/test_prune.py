"""Each pruning rule on its own, and the order of trials: pure functions of a candidate and the facts."""

from __future__ import annotations

import dataclasses

import pytest

from ampkit.tuning import Candidate
from ampkit.tuning._prune import LOADER_BOTTLENECK, expected_gain, loader_bound, plan_stage, stage_order
from ampkit.tuning._space import Facts, PolicyFacts, memory_key

START = Candidate(policy="32-true", micro_batch=8, accumulate=1)
FAST = PolicyFacts(True, True, "fast here")


def _facts(**kw: object) -> Facts:
    policies = {"32-true": FAST, "bf16-mixed": FAST}
    return Facts(**{"device": "cpu", "rows": 8, "policies": policies, "cores": 2, "threads": 2, "blocks": 2, **kw})  # type: ignore[arg-type]


def _pruned(plan: object) -> dict[str, str]:
    return {c.key: why for c, why in plan.pruned}  # type: ignore[attr-defined]


def test_a_policy_the_device_cannot_run_is_pruned_with_the_policys_reason() -> None:
    facts = _facts(policies={"32-true": FAST, "tf32": PolicyFacts(False, False, "TF32 is a CUDA tensor-core mode")})
    plan = plan_stage("precision", START, facts)
    assert plan.kept == [] and _pruned(plan) == {"tf32 mb8x1 compile=off": "not supported on cpu: TF32 is a CUDA tensor-core mode"}


def test_a_policy_the_device_runs_slowly_is_pruned() -> None:
    facts = _facts(policies={"32-true": FAST, "bf16-mixed": FAST, "16-mixed": PolicyFacts(True, False, "no faster than fp32")})
    plan = plan_stage("precision", START, facts)
    assert [c.policy for c in plan.kept] == ["bf16-mixed"]
    assert _pruned(plan)["16-mixed mb8x1 compile=off"] == "slow on cpu: no faster than fp32"


def test_fp8_is_pruned_eagerly_and_by_its_roofline_when_no_layer_pays() -> None:
    fp8 = PolicyFacts(True, True, "sm90", needs_compile=True)
    facts = _facts(device="cuda", policies={"32-true": FAST, "fp8-tensorwise": fp8}, fp8_layers={"fp8-tensorwise": (3, 4)})
    assert "pays only under torch.compile" in _pruned(plan_stage("precision", START, facts))["fp8-tensorwise mb8x1 compile=off"]
    # ... and the compile stage tries it, compiled: 3 of its 4 layers pay.
    assert "fp8-tensorwise mb8x1 compile=model" in {c.key for c in plan_stage("compile", START, facts).kept}
    compiled = dataclasses.replace(START, compile="model")
    assert [c.policy for c in plan_stage("precision", compiled, facts).kept] == ["fp8-tensorwise"]
    facts.fp8_layers["fp8-tensorwise"] = (0, 4)
    reason = _pruned(plan_stage("compile", START, facts))["fp8-tensorwise mb8x1 compile=model"]
    assert reason == "the fp8 roofline predicts none of the 4 Linear layers pays at the batch's 8 rows"
    unsupported = _facts(policies={"32-true": FAST, "fp8-tensorwise": dataclasses.replace(fp8, supported=False)})
    assert all(c.policy == "32-true" for c in plan_stage("compile", START, unsupported).kept + [c for c, _ in plan_stage("compile", START, unsupported).pruned])


def test_fp16_is_pruned_where_the_doctor_saw_activations_overflow_and_bf16_is_not() -> None:
    policies = {"32-true": FAST, "16-mixed": FAST, "bf16-mixed": FAST}
    plan = plan_stage("precision", START, _facts(device="cuda", policies=policies, fp16_overflow=["head"]))
    assert [c.policy for c in plan.kept] == ["bf16-mixed"]
    assert _pruned(plan)["16-mixed mb8x1 compile=off"] == (
        "activations overflow fp16 (above 65504) in head (ampkit doctor): the doctor found no fix that keeps its step finite and in "
        "line with fp32's: use a bf16 policy")
    assert [c.policy for c in plan_stage("precision", START, _facts(device="cuda", policies=policies)).kept] == ["16-mixed", "bf16-mixed"]


def test_where_the_doctor_has_a_fix_for_fp16s_overflow_16_mixed_is_tried_with_it() -> None:
    policies = {"32-true": FAST, "16-mixed": FAST, "16-true": FAST, "bf16-mixed": FAST}
    plan = plan_stage("precision", START, _facts(device="cuda", policies=policies, fp16_overflow=["head", "(the model)"], fp16_keep_fp32=["head"]))
    fixed = dataclasses.replace(START, policy="16-mixed", keep_fp32=("head",))
    assert fixed in plan.kept and {c.policy for c in plan.kept} == {"16-mixed", "bf16-mixed"}
    assert fixed.key == "16-mixed mb8x1 compile=off keep_fp32=head" and fixed.describe(START) == "precision 16-mixed, head kept in fp32"
    assert _pruned(plan)["16-mixed mb8x1 compile=off"].endswith("(ampkit doctor): tried with the doctor's fix instead, keep_fp32=['head']")
    assert _pruned(plan)["16-true mb8x1 compile=off"].endswith("use a bf16 policy")  # the doctor tailored 16-mixed only
    # Without the overflow there is nothing to fix: no such candidate.
    assert all(not c.keep_fp32 for c in plan_stage("precision", START, _facts(device="cuda", policies=policies, fp16_keep_fp32=["head"])).kept)


def test_compile_is_pruned_without_a_compiler_and_regional_without_repeated_blocks() -> None:
    assert "needs a C++ compiler" in _pruned(plan_stage("compile", START, _facts(compiler=False)))["32-true mb8x1 compile=model"]
    plan = plan_stage("compile", START, _facts(blocks=0))
    assert [c.compile for c in plan.kept] == ["model"]
    assert _pruned(plan)["32-true mb8x1 compile=regional"] == "the model has no repeated blocks to compile one by one: compile model covers it"


def test_memory_rules_out_what_is_predicted_not_to_fit_and_nothing_when_unknown() -> None:
    peaks = {memory_key("32-true", 8, False): 900, memory_key("bf16-mixed", 8, False): 400}
    plan = plan_stage("precision", START, _facts(memory_budget=500, predicted_peak=peaks))
    assert [c.policy for c in plan.kept] == ["bf16-mixed"]
    peaks[memory_key("bf16-mixed", 8, False)] = 600
    reason = _pruned(plan_stage("precision", START, _facts(memory_budget=500, predicted_peak=peaks)))["bf16-mixed mb8x1 compile=off"]
    assert reason == "predicted peak 600 B exceeds the 500 B available (ampkit memory)"
    assert [c.policy for c in plan_stage("precision", START, _facts(memory_budget=None, predicted_peak=peaks)).kept] == ["bf16-mixed"]


def test_the_fit_stage_keeps_the_largest_micro_batch_that_fits_and_recompute_only_where_it_lets_a_larger_one_fit() -> None:
    # 8 rows do not fit; 4 fit plainly, 8 fit with recompute: both are tried (fewer steps against less work).
    peaks = {memory_key("32-true", m, r): m * (60 if r else 100) for m in (8, 4, 2, 1) for r in (False, True)}
    plan = plan_stage("fit", START, _facts(memory_budget=500, predicted_peak=peaks))
    assert [(c.micro_batch, c.accumulate, c.recompute) for c in plan.kept] == [(4, 2, False), (8, 1, True)]
    reasons = _pruned(plan)
    assert reasons["32-true mb2x4 compile=off"] == "a micro-batch of 4 fits: a smaller one only adds steps"
    assert reasons["32-true mb4x2 compile=off recompute"] == "fits without recomputing: recompute would add a forward's worth of work to every step"


def test_recompute_is_not_tried_without_repeated_blocks() -> None:
    plan = plan_stage("fit", START, _facts(blocks=0, memory_budget=10, predicted_peak={memory_key("32-true", 8, False): 100}))
    assert _pruned(plan)["32-true mb8x1 compile=off recompute"] == "the model has no repeated blocks to recompute"


def test_kept_candidates_run_in_order_of_expected_gain() -> None:
    policies = {"32-true": FAST, "bf16-mixed": FAST, "bf16-true": FAST, "bf16-true-masters": dataclasses.replace(FAST, masters=True)}
    plan = plan_stage("precision", START, _facts(policies=policies))
    gains = [expected_gain(c, START, _facts(policies=policies)) for c in plan.kept]
    assert gains == sorted(gains, reverse=True) and plan.kept[0].policy == "bf16-true"


def test_the_loader_stage_comes_first_when_the_step_waits_for_data_and_fit_before_everything() -> None:
    assert stage_order(_facts(data_share=LOADER_BOTTLENECK))[0] == "loader"
    assert stage_order(_facts(data_share=LOADER_BOTTLENECK), start_fits=False)[:2] == ["fit", "loader"]
    calm = stage_order(_facts(data_share=0.02))
    assert calm[:2] == ["channels_last", "precision"] and calm.index("loader") > calm.index("compile") and "fit" not in calm


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.9])
def test_the_loaders_expected_gain_is_amdahls_bound_on_the_measured_wait(share: float) -> None:
    assert loader_bound(_facts(data_share=share)) == pytest.approx(1 / (1 - share))


def test_an_empty_stage_says_why() -> None:
    assert plan_stage("loader", START, _facts()).reason == "the data is in memory, not read through a DataLoader: no loader settings to try"
    assert plan_stage("precision", START, _facts(policies={"32-true": FAST})).reason == "nothing to try"


def test_channels_last_is_pruned_for_a_model_without_conv2d_and_kept_for_one_with() -> None:
    plan = plan_stage("channels_last", START, _facts(convs=0))
    assert plan.kept == [] and _pruned(plan) == {
        f"{START.key} channels_last": "the model has no Conv2d: channels_last changes only the layout of convolutions' 4-D inputs and weights"
    }
    assert plan_stage("channels_last", START, _facts(convs=3)).kept == [dataclasses.replace(START, channels_last=True)]
    done = plan_stage("channels_last", dataclasses.replace(START, channels_last=True), _facts(convs=3))
    assert done.kept == [] and done.reason == "the model and its inputs are channels_last already (as given)"


def test_channels_last_runs_before_the_precision_stage_it_makes_fast() -> None:
    order = stage_order(_facts(convs=1))
    assert order.index("channels_last") == order.index("precision") - 1
    assert stage_order(_facts(data_share=LOADER_BOTTLENECK), start_fits=False)[:3] == ["fit", "loader", "channels_last"]


def test_a_compile_that_cannot_pay_within_the_run_is_not_tried_and_a_longer_run_lets_it() -> None:
    # A 30 ms step; whole-model compile estimated at 40 s, a block's at 8 s. Over 1000 steps the whole model's
    # compile adds 40 ms a step: more than even a 3x faster step would save (20 ms). The block's adds 8 ms: tried.
    facts = _facts(step_s=0.030, run_steps=1000, compile_s=lambda c: {"model": 40.0, "regional": 8.0}.get(c.compile or "", 0.0))
    plan = plan_stage("compile", START, facts)
    assert [c.compile for c in plan.kept] == ["regional"]
    assert _pruned(plan)["32-true mb8x1 compile=model"] == (
        "its compile (about 40 s, estimated) spread over the run's 1000 steps (--run-steps) adds 40.0 ms a step, more than a "
        "3x faster step would save (20.0 ms of 30.0 ms): it pays only over a longer run")
    # Ten times the run: 4 ms a step, tried; and ordered by its amortised gain (1.25 / (1 + 1.25 * 4/30) = 1.07)
    # behind the block's (1.2 / (1 + 1.2 * 0.8/30) = 1.16).
    longer = dataclasses.replace(facts, run_steps=10_000)
    assert [c.compile for c in plan_stage("compile", START, longer).kept] == ["regional", "model"]
    assert expected_gain(dataclasses.replace(START, compile="model"), START, longer) == pytest.approx(1 / (1 / 1.25 + 0.004 / 0.030))
    # An incumbent compiled already pays nothing more for a candidate that compiles the same.
    compiled = dataclasses.replace(START, compile="model")
    assert plan_stage("precision", compiled, facts).kept == [dataclasses.replace(compiled, policy="bf16-mixed")]
