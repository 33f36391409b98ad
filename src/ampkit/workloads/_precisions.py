"""A list of precisions, as a tool is given it, made into :class:`~ampkit.policy.Policy` objects once, at the edge.

``--precision bf16,fp16`` on the command line, or ``bench_model(..., ["bf16", my_policy])`` in Python: each name
or alias is resolved here (an unknown one names the closest), a Policy object is taken as it is (its settings,
``keep_fp32`` say, are kept), and a policy given twice runs once. What a tool does with the list (the device
check, the reference first) is the tool's; below this point only Policy objects travel.

    >>> [p.name for p in parse_precisions("bf16, fp16,bf16-mixed")]
    ['bf16-mixed', '16-mixed']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..policy import Policy, get_policy

__all__ = ["parse_precisions"]


def parse_precisions(
    precisions: str | Sequence[str | Policy], option: str = "--precision", check: Callable[[str, Policy], None] | None = None
) -> list[Policy]:
    """``precisions`` (a comma-separated string, or a sequence of names, aliases and Policy objects) as Policy
    objects in the order given, each policy name once. ``check(as_given, policy)`` runs on each (the tool's device
    check, whose message can quote the name as the user typed it). Raises PolicyError for an unknown name,
    ValueError (naming ``option``) for a list that names none."""
    items = precisions.split(",") if isinstance(precisions, str) else list(precisions)
    policies: list[Policy] = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        policy = get_policy(item.strip() if isinstance(item, str) else item)
        if check is not None:
            check(item.strip() if isinstance(item, str) else policy.name, policy)
        if policy.name not in (p.name for p in policies):
            policies.append(policy)
    if not policies:
        raise ValueError(f"{option} {precisions!r} names no policy; give a comma-separated list such as 32-true,bf16-mixed.")
    return policies
