"""An fp32 value as its bf16 rounding plus a 16-bit remainder: the split and the exact reconstruction.

bf16 is the top half of fp32, so an fp32 value ``x`` is its bf16 rounding ``w = RNE(x)`` (the cast torch makes,
round to nearest, ties to even) plus the integer distance between their bit patterns::

    r = bits32(x) - (bits16(w) << 16)        x = from_bits32((bits16(w) << 16) + r)

Integer arithmetic on the bit patterns is exact, and it is monotonic across zeros, subnormals, normals and up to
the infinities (the sign bit cancels: RNE never changes a sign), so one rule covers every finite value.

Exactness. ``r`` lies in [-32768, +32768]: 65537 values, one more than int16 holds. The two ends are the exact
ties (low 16 bits of ``x`` equal to 0x8000), which RNE sends to the even neighbour: ``-32768`` when it rounds up,
``+32768`` when it rounds down. No 16-bit code can hold both for the same ``w`` (65537 fp32 values round to an
even bf16, only 65536 codes exist), so an exact store would need a 17th bit per value. Instead ``+32768`` is
saturated to ``+32767``: that one case, a tie rounded down to even, comes back one fp32 ulp nearer zero
(relative error 2^-24), and still rounds to the same ``w``, so the 16-bit weight is never affected. Every other
value, ``-32768`` ties included, comes back bit for bit.

Special values: +-inf has ``r = 0``. A finite value above bf16's largest rounds to inf, as torch's cast does,
and its remainder (in [-32768, -1]) still brings it back exactly. NaN stays NaN (torch's cast gives a canonical
NaN; its remainder is clamped into int16's range, and any remainder added to a NaN's bf16 bits keeps it a
NaN), but its payload and sign are not kept.

Both directions are a handful of ``torch._foreach`` launches over integer views of the tensors (``.view(torch.int32)``
of an fp32 tensor shares its storage), with no host sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["split_", "merge_", "REMAINDER_MAX"]

REMAINDER_MAX = 32767
"""The saturated end of the remainder: ``+32768`` (a tie rounded down to even) is stored as this."""


def _bits(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(torch.int32) for t in tensors]


@torch.no_grad()
def split_(values: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], scratch: Sequence[torch.Tensor]) -> None:
    """Write ``RNE(values)`` into the bf16 ``weights`` and leave the remainders, as int32, in ``values``' bits.

    ``values`` are consumed: their ``view(torch.int32)`` holds the remainders afterwards, all in int16's range
    (narrow them with a copy). ``scratch`` is fp32 tensors of the same shapes, overwritten. Six launches.

    >>> x = torch.tensor([1.0 + 2**-10, -1.0 - 2**-12, 1.0 + 2**-8])   # under half an ulp, negative, a tie
    >>> w = torch.empty(3, dtype=torch.bfloat16); v = x.clone()
    >>> split_([v], [w], [torch.empty(3)])
    >>> torch.equal(w, x.bfloat16()), v.view(torch.int32).tolist()
    (True, [8192, 2048, 32767])
    """
    if not values:
        return
    torch._foreach_copy_(weights, values)  # the cast every master-weight policy makes: round to nearest even
    torch._foreach_copy_(scratch, weights)  # bf16 -> fp32 widens exactly: the bits of w, shifted left by 16
    bits = _bits(values)
    torch._foreach_sub_(bits, _bits(scratch))
    torch._foreach_clamp_max_(bits, REMAINDER_MAX)  # the one value int16 cannot hold (see the module docstring)
    torch._foreach_clamp_min_(bits, -REMAINDER_MAX - 1)  # only a NaN falls below: it stays a NaN whatever is kept


@torch.no_grad()
def merge_(out: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], remainders: Sequence[torch.Tensor]) -> None:
    """Write into the fp32 ``out`` the values whose bf16 rounding is ``weights`` and remainder ``remainders``.

    Two launches; exact up to the saturated tie (see the module docstring).

    >>> x = torch.tensor([1.0 + 2**-10, -3.0e-41, float("inf")]); v = x.clone()
    >>> w = torch.empty(3, dtype=torch.bfloat16); split_([v], [w], [torch.empty(3)])
    >>> out = torch.empty(3); merge_([out], [w], [v.view(torch.int32).to(torch.int16)])
    >>> torch.equal(out.view(torch.int32), x.view(torch.int32))
    True
    """
    if not out:
        return
    torch._foreach_copy_(out, weights)
    torch._foreach_add_(_bits(out), remainders)  # int16 added to int32 bits: promoted, exact
