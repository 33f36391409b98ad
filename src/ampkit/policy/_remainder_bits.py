"""An fp32 value as its bf16 rounding plus a 16-bit remainder and a tie bit: the split and the exact rebuild.

bf16 is the top half of fp32, so an fp32 value ``x`` is its bf16 rounding ``w = RNE(x)`` (the cast torch makes,
round to nearest, ties to even) plus the integer distance between their bit patterns::

    r = bits32(x) - (bits16(w) << 16)        x = from_bits32((bits16(w) << 16) + r)

Integer arithmetic on the bit patterns is exact, and it is monotonic across zeros, subnormals, normals and up to
the infinities (the sign bit cancels: RNE never changes a sign), so one rule covers every finite value.

Why 16 bits are not enough, and the tie bit. ``r`` lies in [-32768, +32768]: 65537 values. The two ends are the
exact ties (low 16 bits of ``x`` equal to 0x8000), which RNE sends to the even neighbour: ``-32768`` when it
rounds up, ``+32768`` when it rounds down. 65537 fp32 values round to each even bf16 value, and no 16-bit code
can tell them all apart, so the remainder is stored as an int16 in [-32768, +32767] plus one *tie bit* per
value, set exactly where ``r = +32768`` (packed eight to a byte: 1/8 byte per value). Every fp32 value, ties
included, comes back bit for bit. The tie bit is not a nicety: in a real run about one value in 2^17 per step is
such a tie (measured by ``benchmarks/remainder_masters.py``), and a master one ulp off makes a later bf16
rounding differ, after which the run follows another trajectory.

Special values: +-inf has ``r = 0``. A finite value above bf16's largest rounds to inf, as torch's cast does,
and its remainder (in [-32768, -1]) still brings it back exactly. NaN stays NaN (torch's cast gives a canonical
NaN; its remainder is clamped into int16's range, and any remainder added to a NaN's bf16 bits keeps it a
NaN), but its payload and sign are not kept.

Both directions are a handful of ``torch._foreach`` launches over integer views of the tensors (``.view(torch.int32)``
of an fp32 tensor shares its storage), and a few more over the flat remainder and tie buffers; no host sync.
"""

from __future__ import annotations

import torch

__all__ = ["REMAINDER_MAX", "add_ties_", "merge_", "narrow_", "split_", "tie_bytes"]

REMAINDER_MAX = 32767
"""The largest remainder int16 holds; ``+32768`` (a tie rounded down to even) is stored as this with its tie bit set."""
TIE = REMAINDER_MAX + 1


def _bits(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(torch.int32) for t in tensors]


@torch.no_grad()
def split_(values: list[torch.Tensor], weights: list[torch.Tensor], scratch: list[torch.Tensor]) -> None:
    """Write ``RNE(values)`` into the bf16 ``weights`` and leave the remainders, as int32, in ``values``' bits.

    ``values`` are consumed: their ``view(torch.int32)`` holds the remainders afterwards, in [-32768, +32768]
    (store them with :func:`narrow_`). ``scratch`` is fp32 tensors of the same shapes, overwritten. Three launches.

    >>> x = torch.tensor([1.0 + 2**-10, -1.0 - 2**-12, 1.0 + 2**-8])   # under half an ulp, negative, a tie
    >>> w = torch.empty(3, dtype=torch.bfloat16); v = x.clone()
    >>> split_([v], [w], [torch.empty(3)])
    >>> torch.equal(w, x.bfloat16()), v.view(torch.int32).tolist()
    (True, [8192, 2048, 32768])
    """
    if not values:
        return
    torch._foreach_copy_(weights, values)  # the cast every master-weight policy makes: round to nearest even
    torch._foreach_copy_(scratch, weights)  # bf16 -> fp32 widens exactly: the bits of w, shifted left by 16
    torch._foreach_sub_(_bits(values), _bits(scratch))


def tie_bytes(numel: int) -> int:
    """Bytes of the packed tie bits of ``numel`` values (one bit each).

    >>> tie_bytes(1), tie_bytes(8), tie_bytes(9)
    (1, 1, 2)
    """
    return (numel + 7) // 8


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


@torch.no_grad()
def narrow_(bits: torch.Tensor, remainders: torch.Tensor, ties: torch.Tensor) -> None:
    """Store the int32 remainders ``bits`` (1-D, as :func:`split_` left them) as int16 ``remainders`` plus the packed
    tie bits ``ties`` (uint8, :func:`tie_bytes` long). ``bits`` is clamped in place.

    >>> bits = torch.tensor([8192, 32768, -32768, 5], dtype=torch.int32)
    >>> r = torch.empty(4, dtype=torch.int16); t = torch.empty(1, dtype=torch.uint8)
    >>> narrow_(bits, r, t)
    >>> r.tolist(), t.tolist()   # the tie rounded down keeps 32767 and sets its bit (bit 1 of the first byte)
    ([8192, 32767, -32768, 5], [2])
    """
    n = bits.numel()
    flags = torch.zeros(ties.numel() * 8, dtype=torch.uint8, device=bits.device)
    flags[:n] = bits == TIE
    torch.sum(flags.view(-1, 8) << _shifts(bits.device), dim=1, dtype=torch.uint8, out=ties)
    bits.clamp_(-REMAINDER_MAX - 1, REMAINDER_MAX)  # only a NaN falls below: it stays a NaN whatever is kept
    remainders.copy_(bits)  # narrowing is exact now


@torch.no_grad()
def add_ties_(bits: torch.Tensor, ties: torch.Tensor) -> None:
    """Add each value's tie bit to the 1-D int32 ``bits`` (after :func:`merge_`): the ties come back exactly.

    >>> bits = torch.tensor([0, 32767, 7], dtype=torch.int32); add_ties_(bits, torch.tensor([2], dtype=torch.uint8))
    >>> bits.tolist()
    [0, 32768, 7]
    """
    flags = (ties.unsqueeze(1) >> _shifts(ties.device)) & 1
    bits.add_(flags.view(-1)[: bits.numel()])


@torch.no_grad()
def merge_(out: list[torch.Tensor], weights: list[torch.Tensor], remainders: list[torch.Tensor]) -> None:
    """Write into the fp32 ``out`` the values whose bf16 rounding is ``weights`` and remainder ``remainders``.

    Two launches; exact once the tie bits are added back (:func:`add_ties_`).

    >>> x = torch.tensor([1.0 + 2**-10, -3.0e-41, float("inf"), 1.0 + 2**-8]); v = x.clone()
    >>> w = torch.empty(4, dtype=torch.bfloat16); split_([v], [w], [torch.empty(4)])
    >>> r = torch.empty(4, dtype=torch.int16); t = torch.empty(1, dtype=torch.uint8); narrow_(v.view(torch.int32), r, t)
    >>> out = torch.empty(4); merge_([out], [w], [r]); add_ties_(out.view(torch.int32), t)
    >>> torch.equal(out.view(torch.int32), x.view(torch.int32))
    True
    """
    if not out:
        return
    torch._foreach_copy_(out, weights)
    torch._foreach_add_(_bits(out), remainders)  # int16 added to int32 bits: promoted, exact
