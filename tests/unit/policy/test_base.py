"""The parts each policy builds for a run (masters, default scaler, FSDP2's mixed precision and casts), as setup asks
for them: each built-in family's parts follow its description."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampkit.policy import POLICIES, get_policy
from ampkit.policy._masters import MasterWeights
from ampkit.policy._remainder_masters import RemainderMasters
from ampkit.scaling import DynamicLossScaler


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.LayerNorm(8), nn.Linear(8, 2))
    return model


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_default_scaler_is_dynamic_exactly_where_the_policy_scales_the_loss(name: str) -> None:
    policy = get_policy(name)
    scaler = policy.default_scaler()
    assert (type(scaler) is DynamicLossScaler) == (policy.loss_scaling == "dynamic") and (scaler is None) == (policy.loss_scaling == "none")
    if scaler is not None:
        assert scaler is not policy.default_scaler()  # one per run: a scaler holds the run's state


@pytest.mark.parametrize("name, store", [("16-true-masters", MasterWeights), ("bf16-true-masters", MasterWeights), ("bf16-true-remainder", RemainderMasters), ("bf16-true", None), ("16-mixed", None)])
def test_the_masters_cover_the_16_bit_part_with_the_policys_store_and_take_the_optimizers_place(name: str, store: type | None) -> None:
    policy, model = get_policy(name), _model()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    masters = policy.build_masters([model], list(model.named_parameters()), [opt])
    if store is None:
        assert masters is None and opt.param_groups[0]["params"][0] is model[0].weight
        return
    assert type(masters) is store
    assert masters.names == ["0.weight", "0.bias", "3.weight", "3.bias"]  # the norm layers stay fp32: no masters
    policy.convert_module(model, "cpu")
    for name_, value in masters.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, weights[name_])
    stepped = opt.param_groups[0]["params"]
    assert stepped[0] is not model[0].weight and stepped[2] is model[1].weight  # a norm's fp32 parameter is its own master


@pytest.mark.parametrize(
    "name, param_dtype, reduce_dtype, root_output",
    [
        ("32-true", None, None, None),
        ("bf16-mixed", None, None, None),
        ("fp8-tensorwise", None, None, None),
        ("bf16-true", None, torch.float32, None),
        ("bf16-true-kahan", None, torch.float32, None),
        ("bf16-true-masters", torch.bfloat16, torch.float32, torch.float32),
        ("16-true-masters", torch.float16, torch.float32, torch.float32),
    ],
)
def test_fsdp_mixed_precision_is_the_table_of_the_fsdp_module(name: str, param_dtype, reduce_dtype, root_output) -> None:
    policy = get_policy(name)
    unit, root = policy.fsdp_mixed_precision(), policy.fsdp_mixed_precision(root=True)
    assert (unit.param_dtype, unit.reduce_dtype, unit.output_dtype) == (param_dtype, reduce_dtype, None)
    assert (root.param_dtype, root.reduce_dtype, root.output_dtype) == (param_dtype, reduce_dtype, root_output)


def test_before_sharding_a_master_policy_keeps_the_parameters_fp32_and_casts_only_the_16_bit_buffers() -> None:
    model = _model()
    islands = get_policy("bf16-true-masters").prepare_for_sharding(model, "cpu")
    assert [n for n, _ in islands] == ["1", "2"]  # the norms: sharded on their own, in fp32
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the shards will be the masters
    assert model[1].running_mean.dtype == torch.float32  # inside an fp32 island
    plain = _model()
    get_policy("bf16-true").prepare_for_sharding(plain, "cpu")  # no masters: converted as on one device
    assert plain[0].weight.dtype == torch.bfloat16


def test_only_fp8_on_a_gpu_without_compile_gets_advice() -> None:
    fp8 = get_policy("fp8")
    assert "Pass Engine(compile=True)" in fp8.compile_advice("cuda", compiled=False)
    assert fp8.compile_advice("cuda", compiled=True) is None and fp8.compile_advice("cpu", compiled=False) is None
    assert all(get_policy(n).compile_advice("cuda", compiled=False) is None for n in POLICIES if not n.startswith("fp8"))


@pytest.mark.parametrize("name, rounds", [("bf16-true", True), ("16-true", True), ("bf16-true-kahan", False), ("bf16-true-sr", False)])
def test_a_per_step_update_audit_means_something_unless_the_policy_remedies_the_rounding(name: str, rounds: bool) -> None:
    assert get_policy(name).rounds_updates_away() is rounds
