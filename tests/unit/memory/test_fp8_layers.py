"""The fp8 layer plan: the rows each Linear sees, the roofline per layer, and a policy that converts what it says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit._errors import PolicyError
from ampkit.bench._fp8_table import fp8_rows, fp8_summary
from ampkit.memory import estimate
from ampkit.memory._fp8_layers import (
    Fp8Plan,
    fp8_layer_plan,
    group_layers,
    linear_tokens,
    planned_policy,
)
from ampkit.policy import get_policy
from ampkit.policy._fp8_roofline import predict_linear
from ampkit.policy._gpu_specs import gpu_spec


def _gpt():
    from ampkit.workloads import _gpt as gpt

    w = gpt.build("tiny")
    return w.model, w.train_batches[0]


def test_linear_tokens_are_the_batch_rows_and_the_model_is_untouched() -> None:
    model, batch = _gpt()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = batch[0].numel()  # batch x sequence: every Linear of a GPT multiplies one row per token
    assert linear_tokens(model, batch) == {n: rows for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_the_plan_is_the_roofline_at_the_measured_rows_and_decides_by_it() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096), nn.Linear(4096, 16))
    batch = (torch.empty(4, 2048, 4096, device="meta"), None)
    plan = fp8_layer_plan(model, batch, "fp8-tensorwise", gpu="H200")
    spec = gpu_spec("H200")
    assert plan.gpu == "H200" and plan.tokens == 8192
    for p, (k, n) in zip(plan.layers, [(4096, 8192), (8192, 4096), (4096, 16)], strict=True):
        assert p.cost == predict_linear(spec, 8192, k, n)  # type: ignore[arg-type]
        assert p.convert == p.cost.pays
    assert [p.convert for p in plan.layers] == [True, True, False]
    assert plan.linear_bf16_s == pytest.approx(sum(p.cost.bf16_s for p in plan.layers))
    planned = sum(p.cost.fp8_s for p in plan.layers[:2]) + plan.layers[2].cost.bf16_s
    assert plan.linear_planned_s == pytest.approx(planned) and plan.speedup > 1
    assert Fp8Plan.from_dict(plan.to_dict()) == plan


def test_keep_fp32_and_the_recipe_carry_into_the_plan() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 8192), nn.Linear(8192, 4096))
    plan = fp8_layer_plan(model, (torch.empty(8192, 4096, device="meta"), None), get_policy("fp8-rowwise", keep_fp32=["1"]))
    assert plan.policy == "fp8-rowwise" and [p.convert for p in plan.layers] == [True, False]
    assert "keep_fp32" in plan.layers[1].reason


def test_the_planned_policy_keeps_the_settings_of_the_policy_object_it_was_planned_for() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 8192), nn.Linear(8192, 4096))
    given = get_policy("fp8-rowwise", keep_fp32=["1"])
    plan = fp8_layer_plan(model, (torch.empty(8192, 4096, device="meta"), None), given)
    policy = planned_policy(plan, given)
    assert policy.keep_fp32 == ("1",) and (policy.name, policy.tokens) == ("fp8-rowwise", 8192)
    assert planned_policy(plan).keep_fp32 == ()  # control: by the plan's name alone, the setting is lost


def test_the_planned_policy_converts_what_the_plan_says() -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")
    from torchao.float8.float8_linear import Float8Linear

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4096, 4096), nn.Linear(4096, 64), nn.Linear(64, 4096))
    plan = fp8_layer_plan(model, (torch.empty(16384, 4096, device="meta"), None), gpu="H100")
    policy = planned_policy(plan)
    assert (policy.tokens, policy.target) == (16384, "H100")
    import dataclasses

    dataclasses.replace(policy, emulate=True).convert_module(model, "cpu")
    assert [isinstance(m, Float8Linear) for m in model] == [p.convert for p in plan.layers] == [True, False, False]


def test_layers_differing_only_by_a_block_index_fold_into_one_row() -> None:
    model, batch = _gpt()
    groups = group_layers(fp8_layer_plan(model, batch))
    assert sum(g.count for g in groups) == 5 and groups[0].pattern == "blocks.*.attn.qkv"


def test_bad_requests_are_refused_naming_the_fix() -> None:
    model, batch = _gpt()
    with pytest.raises(PolicyError, match="plans an fp8 policy"):
        fp8_layer_plan(model, batch, "bf16-mixed")
    with pytest.raises(PolicyError, match="one of .*H100"):
        fp8_layer_plan(model, batch, gpu="A100")


def test_a_simulated_cuda_estimate_runs_fp8_emulated_with_bf16_mixeds_state() -> None:
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")
    from ampkit.policy import FP8Tensorwise

    model, batch = _gpt()
    opt = lambda p: torch.optim.AdamW(p)
    fp8 = estimate(model, batch, opt, FP8Tensorwise(layers="all"), "cuda")
    bf16 = estimate(model, batch, opt, "bf16-mixed", "cuda")
    assert fp8.precision == "fp8-tensorwise" and fp8.simulated_on == "cpu"
    # fp32 weights, grads and Adam state: fp8 changes the matmuls, not what is stored.
    assert (fp8.parameters, fp8.gradients, fp8.optimizer_state) == (bf16.parameters, bf16.gradients, bf16.optimizer_state)


def test_a_layer_that_sees_fewer_rows_is_planned_and_run_at_its_own() -> None:
    """The head of a classifier sees one row per sequence: at those rows it loses in fp8, though the same shape wins
    at the body's rows. The planned policy converts what the plan says, not what the most rows would."""
    pytest.importorskip("torchao", reason="Requires: torchao (pip install -e '.[fp8]')")
    import dataclasses

    from torchao.float8.float8_linear import Float8Linear

    class LastPosition(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4096, 4096)
            self.head = nn.Linear(4096, 4096)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x)[:, -1])

    with torch.device("meta"):
        model = LastPosition()
    plan = fp8_layer_plan(model, (torch.empty(8, 2048, 4096, device="meta"), None), gpu="H100")
    assert [(p.name, p.cost.tokens, p.convert) for p in plan.layers] == [("body", 16384, True), ("head", 8, False)]
    dataclasses.replace(planned_policy(plan), emulate=True).convert_module(model, "cpu")
    assert isinstance(model.body, Float8Linear) and not isinstance(model.head, Float8Linear)


def test_conv1d_layers_are_planned_at_their_rows_and_named_as_not_converted(hf_conv1d: type[nn.Module]) -> None:
    # Hugging Face's GPT-2 builds every projection from Conv1D (a Linear with its weight stored transposed), which
    # torchao's float8 conversion does not swap: the plan counts them, at their own shape, and says so.
    with torch.device("meta"):
        model = nn.Sequential(hf_conv1d(16384, 4096), nn.GELU(), hf_conv1d(4096, 16384), nn.Linear(4096, 16))
    batch = (torch.empty(4, 2048, 4096, device="meta"), None)
    assert linear_tokens(model, batch) == {"0": 8192, "2": 8192, "3": 8192}
    plan = fp8_layer_plan(model, batch, "fp8-tensorwise", gpu="H100")
    assert [(p.name, p.kind, p.convert) for p in plan.layers] == [("0", "Conv1D", False), ("2", "Conv1D", False), ("3", "Linear", False)]
    assert plan.layers[0].cost == predict_linear(gpu_spec("H100"), 8192, 4096, 16384)  # type: ignore[arg-type]
    assert plan.layers[0].cost.pays  # as an nn.Linear it would run in fp8: the plan names why it does not
    assert Fp8Plan.from_dict(plan.to_dict()) == plan
    assert [row[0] for row in fp8_rows(plan)] == ["0 (Conv1D)", "2 (Conv1D)", "3"]
    summary = fp8_summary(plan)
    assert "0 of 3 Linear layers in fp8" in summary and "2 of the 3 layers are Hugging Face Conv1D" in summary
