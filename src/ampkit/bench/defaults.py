"""The policies ``ampkit bench`` runs when not told, and how ``--precision`` is read.

(The device, the workload and its size are chosen in :mod:`ampkit.workloads.defaults`, for every tool.) The
default is chosen per machine, from what the policies report about it (:meth:`Policy.support`):

- policies: ``32-true`` (the reference) and every other policy the device runs *fast*. Policies the device
  runs only slowly (fp16 on a CPU: no faster than fp32, ~170x slower for convolution backward) are left out
  of the default so it stays within its time budget; naming them in ``--precision`` runs them. So are the fp8
  policies, which pay only compiled and on large layers (``--precision fp8 --compile`` runs them).

    >>> "32-true" in default_precisions(torch.device("cpu"))[0]
    True
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedPolicyError
from ..policy import get_policy, policy_names
from .runner import REFERENCE

__all__ = ["default_precisions", "resolve_precisions"]


def default_precisions(device: torch.device) -> tuple[list[str], dict[str, str]]:
    """(policies to run, {policy left out: why}) for ``device``; the reference always comes first."""
    chosen, left_out = [REFERENCE], {}
    for name in policy_names():
        if name == REFERENCE:
            continue
        policy = get_policy(name)
        support = policy.support(device)
        if support.supported and support.fast and not policy.needs_compile:
            chosen.append(name)
        elif support.supported and support.fast:
            # fp8 pays only compiled, and only on layers large enough: the default bench is eager on gpt large,
            # whose layers all lose in fp8 (the plan converts none), so it would time bf16-mixed twice.
            left_out[name] = "pays only under torch.compile on large Linear layers: name it with --compile (see --fp8 for the layer plan)"
        else:
            left_out[name] = support.reason
    return chosen, left_out


def resolve_precisions(text: str, device: torch.device) -> list[str]:
    """Parse ``--precision`` (comma-separated names or aliases) into canonical names, reference first.

    Unknown names raise PolicyError (naming the closest); a policy the device cannot run raises
    UnsupportedPolicyError saying what to use instead. Duplicates (``bf16,bf16-mixed``) collapse.

    >>> resolve_precisions("bf16, fp16", torch.device("cpu"))
    ['32-true', 'bf16-mixed', '16-mixed']
    """
    names: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue
        policy = get_policy(part.strip())
        support = policy.support(device)
        if not support.supported:
            raise UnsupportedPolicyError(f"--precision {part.strip()}: {policy.name} cannot run on {device}: {support.reason}.")
        if policy.name not in names:
            names.append(policy.name)
    if not names:
        raise ValueError(f"--precision {text!r} names no policy; give a comma-separated list such as 32-true,bf16-mixed.")
    # The reference is what speed-ups, memory savings and tolerances are measured against, so it always runs.
    return [REFERENCE] + [n for n in names if n != REFERENCE]
