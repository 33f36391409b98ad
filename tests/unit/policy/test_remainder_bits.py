"""The split of fp32 values into (bf16 rounding, int16 remainder, tie bit) and its reconstruction, on adversarial bit patterns."""

from __future__ import annotations

from typing import Any

import torch

from ampkit._compat import TorchDispatchMode
from ampkit.policy._remainder_bits import add_ties_, merge_, narrow_, split_, tie_bytes


def _patterns() -> torch.Tensor:
    """fp32 bit patterns: every high half with the low halves that matter, and every low half of chosen high halves."""
    highs = torch.arange(-(2**15), 2**15, dtype=torch.int64)
    lows = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC0DE], dtype=torch.int64)
    every_high = (highs[:, None] << 16 | lows[None, :]).flatten()
    chosen = torch.tensor(
        [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x0081, 0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x7F7E, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80],
        dtype=torch.int64,
    )  # zeros, subnormals, the smallest normals, 1 (even, odd), -1, bf16's largest, inf
    every_low = (chosen[:, None] << 16 | torch.arange(2**16, dtype=torch.int64)[None, :]).flatten()
    bits = torch.cat([every_high, every_low])
    return ((bits + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)  # as int32 two's complement


def _round_trip(x: torch.Tensor, with_ties: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.empty(x.shape, dtype=torch.bfloat16)
    values = x.clone()
    split_([values], [weights], [torch.empty_like(x)])
    remainders = torch.empty(x.shape, dtype=torch.int16)
    ties = torch.empty(tie_bytes(x.numel()), dtype=torch.uint8)
    narrow_(values.view(torch.int32), remainders, ties)
    out = torch.empty_like(x)
    merge_([out], [weights], [remainders])
    if with_ties:
        add_ties_(out.view(torch.int32), ties)
    return weights, out


def test_the_weight_is_torchs_own_rounding_and_every_value_comes_back_bit_for_bit() -> None:
    x = _patterns()
    finite_or_inf = ~x.isnan()
    weights, out = _round_trip(x)
    # The 16-bit weight is exactly the cast bf16-true-masters makes, NaN included.
    assert torch.equal(weights.view(torch.int16)[finite_or_inf], x.bfloat16().view(torch.int16)[finite_or_inf])
    assert weights[~finite_or_inf].isnan().all()
    assert torch.equal(out.view(torch.int32)[finite_or_inf], x.view(torch.int32)[finite_or_inf])
    assert out[~finite_or_inf].isnan().all()  # NaN stays NaN


def test_without_its_tie_bit_a_tie_rounded_down_comes_back_one_ulp_nearer_zero() -> None:
    # Why the bit exists: low half 0x8000 rounded down to an even bf16 (bit 16 clear) needs a 17th bit.
    x = _patterns()
    finite_or_inf = ~x.isnan()
    _, out = _round_trip(x, with_ties=False)
    xb = x.view(torch.int32)
    saturated = finite_or_inf & ((xb & 0xFFFF) == 0x8000) & ((xb & 0x10000) == 0)
    assert saturated.any() and (((xb & 0xFFFF) == 0x8000) & ~saturated & finite_or_inf).any()  # both kinds of tie were tried
    expected = torch.where(saturated, xb - 1, xb)
    assert torch.equal(out.view(torch.int32)[finite_or_inf], expected[finite_or_inf])


def test_values_that_round_to_infinity_come_back_exactly() -> None:
    big = torch.tensor([3.3961e38, 3.4e38, -3.4e38, torch.finfo(torch.float32).max, float("inf"), -float("inf")])
    weights, out = _round_trip(big)
    assert torch.equal(weights.view(torch.int16), big.bfloat16().view(torch.int16))
    assert weights[1:].isinf().all()  # bf16's largest is 3.39e38
    assert torch.equal(out.view(torch.int32), big.view(torch.int32))


class _Dispatched(TorchDispatchMode):
    """Records every op that reaches torch's dispatcher inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_empty_lists_launch_nothing_and_an_empty_tensor_round_trips() -> None:
    # A parameter group may hold no parameter; torch's foreach ops refuse empty lists ("Tensor list must have at
    # least one tensor"), so both functions return before them.
    with _Dispatched() as dispatched:
        split_([], [], [])
        merge_([], [], [])
    assert dispatched.ops == []
    with _Dispatched() as dispatched:  # the control: the recorder sees the ops of a one-value round trip
        _round_trip(torch.ones(1))
    assert any("_foreach_copy_" in op for op in dispatched.ops)
    weights, out = _round_trip(torch.empty(0))  # an empty parameter: zero tie bytes, nothing to pack
    assert weights.shape == out.shape == (0,) and weights.dtype == torch.bfloat16 and out.dtype == torch.float32
