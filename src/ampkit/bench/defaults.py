"""What ``ampkit bench`` runs when not told: the device, the workload, its size, and the policies.

The default is chosen per machine, from what the policies report about it (:meth:`Policy.support`):

- device: the GPU when there is one, else the CPU;
- workload: the one that shows the effect best there and checks accuracy with an eval metric. On a CPU that is
  ``digits`` (real data; measured on the development machine: bf16-mixed 1.65x faster than fp32 with 36%
  less activation memory, against 1.44x for ``gpt``, whose CPU attention kernel is slower in bf16, and 1.24x
  for ``segment``; ``resnet`` has no eval metric). On a GPU it is ``gpt``: transformer matmuls are what tensor
  cores accelerate most;
- size: ``small`` on CPU (<= 2 minutes on 2 cores), ``large`` on a GPU: for ``gpt``, GPT-2 small's transformer
  at 8 x 1024 tokens a step, the shape GPU users train; a small model would only measure kernel-launch latency;
- policies: ``32-true`` (the reference) and every other policy the device runs *fast*. Policies the device
  runs only slowly (fp16 on a CPU: no faster than fp32, ~170x slower for convolution backward) are left out
  of the default so it stays within its time budget; naming them in ``--precision`` runs them. So are the fp8
  policies, which pay only compiled and on large layers (``--precision fp8 --compile`` runs them).

    >>> default_size(torch.device("cpu"))
    'small'
    >>> "32-true" in default_precisions(torch.device("cpu"))[0]
    True
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedPolicyError
from ..policy import get_policy, policy_names
from .runner import REFERENCE

__all__ = ["default_device", "default_workload", "default_size", "default_precisions", "resolve_precisions"]


def default_device() -> torch.device:
    """The first CUDA device when there is one, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def default_workload(device: torch.device) -> str:
    """``gpt`` on a GPU, ``digits`` on a CPU: where each shows the effect best (see the module notes)."""
    return "gpt" if device.type == "cuda" else "digits"


def default_size(device: torch.device) -> str:
    """``small`` on CPU (the 2-minute budget), ``large`` on a GPU."""
    return "large" if device.type == "cuda" else "small"


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
