"""A ``keep_fp32`` list said in module types where a type covers it: ``nn.BatchNorm2d`` for a ResNet's 23 norms.

The doctor finds modules one by one; the list it pastes names a module type instead of its modules when every
module of that type in the model is listed (no module of the type is left healthy, so keeping the type keeps exactly
the modules found) and the type holds at least two (one module reads better by its name). Only ``torch.nn`` types
are collapsed: ``nn.<Name>`` pastes with the ``from torch import nn`` every script has, where another library's
class would need its own import. ``Engine(keep_fp32=...)`` takes both forms (:func:`ampkit.policy.get_policy`).

    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2), nn.Linear(2, 2), nn.LayerNorm(2))
    >>> collapse_to_types(net, ["1", "3"]), collapse_to_types(net, ["0", "1", "3"])
    ([<class 'torch.nn.modules.normalization.LayerNorm'>], ['0', <class 'torch.nn.modules.normalization.LayerNorm'>])
    >>> collapse_to_types(net, ["1"])
    ['1']
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["collapse_to_types"]


def collapse_to_types(model: nn.Module, names: Sequence[str]) -> list[str | type[nn.Module]]:
    """``names`` (modules of ``model``) with each torch.nn type whose every module is listed in place of them, at the
    place of its first module."""
    listed = set(names)
    modules = dict(model.named_modules())
    out: list[str | type[nn.Module]] = []
    for name in names:
        kind = type(modules[name]) if name in modules else None
        if kind is None or not kind.__module__.startswith("torch.nn"):
            out.append(name)
            continue
        # keep_fp32 matches a type with isinstance: a subclass's modules count as the type's too.
        members = [n for n, m in modules.items() if isinstance(m, kind)]
        if len(members) >= 2 and all(n in listed for n in members):
            if kind not in out:
                out.append(kind)
        else:
            out.append(name)
    return out
