"""The policies ``ampkit bench`` runs: the ones asked for, or by default every policy the device runs fast.

Both come back as :class:`~ampkit.policy.Policy` objects, the reference (``32-true``) first: the command line and
:func:`~ampkit.bench.bench_model` turn what they were given into policies here, once, and the runner takes them
as they are. (The device, the workload and its size are chosen in :mod:`ampkit.workloads._defaults`, for every tool.)

- default: ``32-true`` (the reference) and every other policy the device runs *fast*, from what the policies
  report about it (:meth:`Policy.support`). Policies the device runs only slowly (fp16 on a CPU: no faster than
  fp32, ~170x slower for convolution backward) are left out of the default so it stays within its time budget;
  naming them in ``--precision`` runs them. So are the fp8 policies, which pay only compiled and on large layers
  (``--precision fp8 --compile`` runs them).

    >>> [p.name for p in resolve_precisions("bf16, fp16", torch.device("cpu"))]
    ['32-true', 'bf16-mixed', '16-mixed']
    >>> "32-true" in [p.name for p in default_precisions(torch.device("cpu"))[0]]
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._errors import UnsupportedPolicyError
from ..policy import Policy, get_policy, policy_names
from ..workloads._precisions import parse_precisions
from ._runner import REFERENCE

__all__ = ["default_precisions", "resolve_precisions"]


def default_precisions(device: torch.device) -> tuple[list[Policy], dict[str, str]]:
    """(policies to run, {name of a policy left out: why}) for ``device``; the reference always comes first."""
    chosen, left_out = [get_policy(REFERENCE)], {}
    for name in policy_names():
        if name == REFERENCE:
            continue
        policy = get_policy(name)
        support = policy.support(device)
        if support.supported and support.fast and not policy.needs_compile:
            chosen.append(policy)
        elif support.supported and support.fast:
            # fp8 pays only compiled, and only on layers large enough: the default bench is eager on gpt large,
            # whose layers all lose in fp8 (the plan converts none), so it would time bf16-mixed twice.
            left_out[name] = "pays only under torch.compile on large Linear layers: name it with --compile (see --fp8 for the layer plan)"
        else:
            left_out[name] = support.reason
    return chosen, left_out


def resolve_precisions(precisions: str | Sequence[str | Policy], device: torch.device) -> list[Policy]:
    """``--precision`` (comma-separated names or aliases), or a list of names and Policy objects, as the policies to
    run on ``device``, reference first.

    Unknown names raise PolicyError (naming the closest); a policy the device cannot run raises
    UnsupportedPolicyError saying what to use instead. Duplicates (``bf16,bf16-mixed``) collapse.
    """

    def runs_here(typed: str, policy: Policy) -> None:
        support = policy.support(device)
        if not support.supported:
            raise UnsupportedPolicyError(f"--precision {typed}: {policy.name} cannot run on {device}: {support.reason}.")

    policies = parse_precisions(precisions, check=runs_here)
    # The reference is what speed-ups, memory savings and tolerances are measured against, so it always runs.
    reference = next((p for p in policies if p.name == REFERENCE), None) or get_policy(REFERENCE)
    return [reference] + [p for p in policies if p.name != REFERENCE]
