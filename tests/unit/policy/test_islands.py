"""fp32 islands: selecting modules by type or name, running them in fp32 under autocast, casting nested values."""

from __future__ import annotations

import collections
import copy
import pickle
from typing import NamedTuple

import pytest
import torch
from torch import nn

from ampkit._errors import PolicyError
from ampkit.policy import get_policy
from ampkit.policy._islands import NORM_TYPES, cast_floating, is_fp32_island, make_fp32_island, match_modules


def tower() -> nn.Module:
    """root -> embed, blocks.{0,1}.{attn, norm, mlp.{0,1}}, head; names chosen to exercise wildcards."""
    torch.manual_seed(0)

    def block() -> nn.Module:
        b = nn.Module()
        b.attn = nn.Linear(4, 4)
        b.norm = nn.LayerNorm(4)
        b.mlp = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        return b

    root = nn.Module()
    root.embed = nn.Embedding(10, 4)
    root.blocks = nn.ModuleList([block(), block()])
    root.head = nn.Linear(4, 2)
    return root


def names(pairs: list[tuple[str, nn.Module]]) -> list[str]:
    return [name for name, _ in pairs]


# ------------------------------------------------------------------------------------- match_modules
def test_match_by_type_returns_every_instance_in_order() -> None:
    model = tower()
    found = match_modules(model, [nn.LayerNorm])
    assert names(found) == ["blocks.0.norm", "blocks.0.mlp.1", "blocks.1.norm", "blocks.1.mlp.1"]
    assert all(m is model.get_submodule(n) for n, m in found)


def test_match_by_exact_name() -> None:
    model = tower()
    assert match_modules(model, ["head"]) == [("head", model.head)]
    assert names(match_modules(model, ["blocks.1.attn"])) == ["blocks.1.attn"]


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("blocks.*.attn", ["blocks.0.attn", "blocks.1.attn"]),
        ("blocks.?.norm", ["blocks.0.norm", "blocks.1.norm"]),
        ("*.mlp", ["blocks.0.mlp", "blocks.1.mlp"]),
        ("blocks.[1]", ["blocks.1"]),
        ("*head", ["head"]),
    ],
)
def test_match_by_wildcard_name(pattern: str, expected: list[str]) -> None:
    assert names(match_modules(tower(), [pattern])) == expected


def test_wildcards_are_case_sensitive() -> None:
    with pytest.raises(PolicyError):
        match_modules(tower(), ["HEAD"])


def test_only_the_outermost_selected_module_is_returned() -> None:
    model = tower()
    # "blocks.0" contains a LayerNorm and blocks.0.mlp; neither is returned separately.
    found = match_modules(model, ["blocks.0", nn.LayerNorm, "blocks.*.mlp"])
    assert names(found) == ["blocks.0", "blocks.1.norm", "blocks.1.mlp"]
    # "blocks.*" matches every depth below blocks; only the two blocks are outermost.
    assert names(match_modules(model, ["blocks.*"])) == ["blocks.0", "blocks.1"]


def test_selecting_the_root_selects_nothing_else() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    assert match_modules(model, [nn.Sequential, nn.Linear]) == [("", model)]


def test_prefix_that_is_not_a_parent_is_not_skipped() -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(11)])
    assert names(match_modules(model, ["1", "10"])) == ["1", "10"]


def test_empty_keep_selects_nothing() -> None:
    assert match_modules(tower(), []) == []


def test_a_name_that_matches_nothing_raises_with_suggestions() -> None:
    with pytest.raises(PolicyError, match=r"keep_fp32 entry 'blocks.0.atn' matches no module of Module\. Did you mean 'blocks.0.attn'"):
        match_modules(tower(), ["blocks.0.atn"])


def test_a_name_far_from_everything_raises_without_a_guess() -> None:
    with pytest.raises(PolicyError, match="matches no module") as info:
        match_modules(tower(), ["zzzzzzzzzzzz"])
    assert "Did you mean" not in str(info.value)


def test_an_unmatched_name_raises_even_when_other_entries_match() -> None:
    with pytest.raises(PolicyError, match="'hed'"):
        match_modules(tower(), [nn.LayerNorm, "head", "hed"])


@pytest.mark.parametrize("bad", [int, torch.Tensor, nn.Linear(2, 2), 3, None])
def test_entries_that_are_neither_names_nor_module_types_raise(bad: object) -> None:
    with pytest.raises(PolicyError, match="keep_fp32 takes module names or nn.Module subclasses"):
        match_modules(tower(), ["head", bad])  # type: ignore[list-item]


def test_norm_types_cover_the_normalisation_families() -> None:
    norms = [nn.BatchNorm1d(2), nn.BatchNorm2d(2), nn.InstanceNorm1d(2), nn.SyncBatchNorm(2)]
    norms += [nn.LayerNorm(2), nn.GroupNorm(1, 2), nn.LocalResponseNorm(2), nn.RMSNorm(2)]
    for module in norms:
        assert isinstance(module, NORM_TYPES), type(module).__name__
    for module in [nn.Linear(2, 2), nn.Conv1d(2, 2, 1), nn.Embedding(2, 2), nn.Dropout()]:
        assert not isinstance(module, NORM_TYPES), type(module).__name__


# ------------------------------------------------------------------------------------- make_fp32_island
def test_island_runs_in_fp32_under_16_bit_autocast(device: torch.device, half_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    island, control = nn.Linear(8, 8).to(device), nn.Linear(8, 8).to(device)
    control.load_state_dict(island.state_dict())
    make_fp32_island(island, device.type)
    x = torch.randn(4, 8).to(device)
    expected = control(x)  # fp32, no autocast
    with torch.autocast(device.type, dtype=half_dtype):
        assert control(x).dtype == half_dtype  # control: autocast would lower it
        out = island(x)
        assert torch.is_autocast_enabled(device.type), "autocast must be back on after the island"
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_island_upcasts_16_bit_inputs_and_kwargs(device: torch.device, half_dtype: torch.dtype) -> None:
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            self.seen = (x.dtype, scale.dtype)
            return x * scale

    module = Scaled()
    make_fp32_island(module, device.type)
    x = torch.randn(3).to(device, half_dtype)
    out = module(x, scale=torch.tensor(3.0, dtype=torch.float16, device=device))
    assert module.seen == (torch.float32, torch.float32)
    assert torch.equal(out, x.float() * 3.0)


def test_island_casts_outputs_to_output_dtype(device: torch.device, half_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    norm, control = nn.LayerNorm(8), nn.LayerNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    control.load_state_dict(norm.state_dict())
    norm, control = norm.to(device), control.to(device)
    make_fp32_island(norm, device.type, output_dtype=half_dtype)
    x = torch.randn(4, 8).to(device, half_dtype)
    out = norm(x)
    assert out.dtype == half_dtype
    assert torch.equal(out, control(x.float()).to(half_dtype))


def test_island_keeps_the_module_s_hooks_working() -> None:
    module = nn.Linear(2, 2)
    calls = []
    module.register_forward_hook(lambda m, a, out: calls.append(out.dtype))
    make_fp32_island(module, "cpu", output_dtype=torch.float16)
    module(torch.randn(1, 2))
    assert calls == [torch.float16]


def test_is_fp32_island_reports_the_marking() -> None:
    module = nn.Linear(2, 2)
    assert not is_fp32_island(module)
    make_fp32_island(module, "cpu")
    assert is_fp32_island(module)
    assert not is_fp32_island(nn.Linear(2, 2))


def test_making_an_island_twice_wraps_once() -> None:
    torch.manual_seed(0)
    module = nn.Linear(4, 4)
    make_fp32_island(module, "cpu", output_dtype=torch.bfloat16)
    make_fp32_island(module, "cpu", output_dtype=torch.float16)
    assert module.forward.args == (module, "cpu", torch.float16)  # replaced, not nested
    x = torch.randn(2, 4)
    assert torch.equal(module(x), nn.functional.linear(x, module.weight, module.bias).half())


def test_island_survives_deepcopy_bound_to_the_copy() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    make_fp32_island(module[0], "cpu")
    clone = copy.deepcopy(module)
    assert is_fp32_island(clone[0])
    assert clone[0].forward.args[0] is clone[0], "the copy's forward must be bound to the copy"
    x = torch.randn(3, 4)
    expected = module(x)
    with torch.no_grad():
        clone[0].weight.mul_(-1.0)
    assert torch.equal(module(x), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = clone[0](x)
    assert out.dtype == torch.float32
    assert torch.equal(out, nn.functional.linear(x, clone[0].weight, clone[0].bias))


def test_island_survives_pickling() -> None:
    torch.manual_seed(0)
    module = nn.Linear(4, 4)
    make_fp32_island(module, "cpu", output_dtype=torch.bfloat16)
    clone = pickle.loads(pickle.dumps(module))
    assert is_fp32_island(clone) and clone.forward.args[0] is clone
    x = torch.randn(2, 4)
    assert torch.equal(clone(x), module(x))


def test_module_with_a_patched_instance_forward_is_refused() -> None:
    module = nn.Linear(2, 2)
    module.forward = lambda x: x  # type: ignore[method-assign]
    with pytest.raises(PolicyError, match="Linear already has an instance-level forward"):
        make_fp32_island(module, "cpu")
    assert not is_fp32_island(module)


@pytest.mark.parametrize("name", ["bf16-mixed", "bf16-true", "32-true"])
def test_policies_refuse_to_keep_a_patched_module_in_fp32(name: str) -> None:
    model = tower()
    model.head.forward = lambda x: x  # type: ignore[method-assign]
    with pytest.raises(PolicyError, match="instance-level forward"):
        get_policy(name, keep_fp32=["head"]).convert_module(model, "cpu")


# ------------------------------------------------------------------------------------- cast_floating
class Pair(NamedTuple):
    left: object
    right: object


def test_cast_floating_reaches_into_nested_containers() -> None:
    ids = torch.arange(3)
    value = {
        "a": [torch.ones(2), (torch.zeros(1, dtype=torch.float64), 7)],
        "b": Pair(torch.ones(1, dtype=torch.float16), {"c": ids, "d": "text"}),
        "e": None,
    }
    out = cast_floating(value, torch.bfloat16)
    assert type(out) is dict and list(out) == ["a", "b", "e"]
    assert type(out["a"]) is list and type(out["a"][1]) is tuple
    assert out["a"][0].dtype == torch.bfloat16 and out["a"][1][0].dtype == torch.bfloat16
    assert out["a"][1][1] == 7
    assert type(out["b"]) is Pair
    assert out["b"].left.dtype == torch.bfloat16
    assert out["b"].right["c"] is ids and out["b"].right["d"] == "text"
    assert out["e"] is None
    assert torch.equal(out["a"][0], torch.ones(2, dtype=torch.bfloat16))


def test_cast_floating_values_are_rounded_once_from_the_source() -> None:
    x = torch.randn(100, dtype=torch.float64)
    assert torch.equal(cast_floating([x], torch.float16)[0], x.to(torch.float16))


def test_cast_floating_leaves_ints_bools_complex_and_matching_dtypes_alone() -> None:
    same = torch.ones(2, dtype=torch.bfloat16)
    ints, flags, cplx = torch.arange(2), torch.tensor([True]), torch.ones(1, dtype=torch.complex64)
    out = cast_floating((same, ints, flags, cplx, 3, 2.5), torch.bfloat16)
    assert out[0] is same and out[1] is ints and out[2] is flags and out[3] is cplx
    assert out[4:] == (3, 2.5)


def test_cast_floating_keeps_dict_and_sequence_subclasses() -> None:
    ordered = collections.OrderedDict([("z", torch.ones(1)), ("a", torch.ones(1))])
    out = cast_floating(ordered, torch.float16)
    assert type(out) is collections.OrderedDict and list(out) == ["z", "a"]
    assert torch.Size([2, 3]) == cast_floating(torch.Size([2, 3]), torch.float16)


def test_cast_floating_keeps_autograd_connected() -> None:
    x = torch.ones(2, requires_grad=True)
    cast_floating([x], torch.bfloat16)[0].float().sum().backward()
    assert torch.equal(x.grad, torch.ones(2))


def test_cast_floating_handles_defaultdict() -> None:
    value = collections.defaultdict(list, a=torch.ones(1))
    out = cast_floating(value, torch.bfloat16)
    assert type(out) is collections.defaultdict and out.default_factory is list
    assert out["a"].dtype == torch.bfloat16
