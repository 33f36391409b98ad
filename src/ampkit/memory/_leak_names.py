"""Names by which the user knows an object the holder search found: a variable, a global, an attribute, a key.

:class:`_Namer` looks in the training loop's frames first, then in the dicts and objects that refer to the
object (module globals, instance attributes, items of a named dict), through the garbage collector's referrers.
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import torch

from ._accounting import tensor_bytes

__all__: list[str] = []  # private helpers of ampkit.memory._leak_holders

_CONTAINERS = (list, dict, deque)


class _Namer:
    """Names by which the user knows an object: a variable of the calling frames, a module global, an attribute
    of an object (``Trainer.total``), or a key of a named dict (``metrics['loss']``)."""

    _FRAMES = 64

    def __init__(self, frame: FrameType | None) -> None:
        self.frames: list[FrameType] = []
        while frame is not None and len(self.frames) < self._FRAMES:
            self.frames.append(frame)
            frame = frame.f_back

    def close(self) -> None:
        self.frames.clear()  # frames refer to everything: drop them as soon as the search is over

    def _scopes(self) -> Iterator[tuple[Any, str]]:
        for f in self.frames:
            name = f.f_code.co_name
            yield f.f_locals, "" if name.startswith("<") else f" in {name}()"
            yield f.f_globals, ""

    def names(self, objs: Sequence[Any], depth: int = 1) -> dict[int, str]:
        ids = {id(o) for o in objs}
        found: dict[int, str] = {}
        # The loop's own frames first: that is where `total` and `outputs` usually live.
        scanned: set[int] = set()
        for scope, where in self._scopes():
            if id(scope) in scanned:
                continue
            scanned.add(id(scope))
            for name, value in list(scope.items()):
                if id(value) in ids and id(value) not in found and isinstance(name, str) and not name.startswith("__"):
                    found[id(value)] = f"`{name}`{where}"
        rest = [o for o in objs if id(o) not in found]
        if not rest:
            return found
        # Then the dicts that refer to them: module globals, instance attributes, items of a named dict.
        rest_ids = {id(o) for o in rest}
        modules = {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None and hasattr(m, "__dict__")}
        keyed: list[tuple[dict[Any, Any], Any, Any]] = []
        for r in gc.get_referrers(*rest):
            if not isinstance(r, dict):
                # Python 3.11+ keeps an object's attributes inline, without a __dict__ object until asked for one:
                # the referrer is then the object itself.
                attrs = _attributes(r)
                for key, value in attrs.items():
                    if id(value) in rest_ids and isinstance(key, str):
                        found.setdefault(id(value), f"`{type(r).__name__}.{key}`")
                continue
            if id(r) in scanned:
                continue
            for key, value in list(r.items()):
                if id(value) not in rest_ids:
                    continue
                if id(r) in modules:
                    found.setdefault(id(value), f"`{modules[id(r)]}.{key}`")
                else:
                    keyed.append((r, key, value))
        if not keyed:
            return found
        owners: dict[int, str | None] = {id(d): None for d, _, _ in keyed}
        for owner in gc.get_referrers(*[d for d, _, _ in keyed]):
            d = _attributes(owner)
            if id(d) in owners and owners[id(d)] is None:
                owners[id(d)] = type(owner).__name__
        plain = [d for d, _, _ in keyed if owners[id(d)] is None]
        dict_names = self.names(plain, depth - 1) if plain and depth > 0 else {}
        for d, key, value in keyed:
            if owners[id(d)] is not None and isinstance(key, str):
                found.setdefault(id(value), f"`{owners[id(d)]}.{key}`")
            elif id(d) in dict_names:
                name = dict_names[id(d)]
                tick = name.index("`", 1)  # metrics['loss'] in train(): the key goes inside the backticks
                found.setdefault(id(value), f"{name[:tick]}[{key!r}]{name[tick:]}")
        return found

    def containers_of(self, objs: list[Any], ours: Sequence[Any] = ()) -> dict[int, Any]:
        """The list, deque or dict holding each of ``objs`` (through a tuple, as in ``history.append((out, y))``).

        ``ours``: the caller's own lists and tuples that refer to ``objs``, not to be taken for the user's.
        """
        ids = {id(o) for o in objs}
        skip = {id(objs), *(id(o) for o in ours), *(id(scope) for scope, _ in self._scopes())}
        out: dict[int, Any] = {}
        tuples: list[tuple[Any, ...]] = []
        for r in gc.get_referrers(*objs):
            if id(r) in skip:
                continue
            if isinstance(r, tuple) and not (len(r) == len(objs) and all(a is b for a, b in zip(r, objs))):
                tuples.append(r)
            elif isinstance(r, _CONTAINERS):
                for v in r.values() if isinstance(r, dict) else r:
                    if id(v) in ids:
                        out.setdefault(id(v), r)
        if tuples:
            by_tuple = {id(t): t for t in tuples}
            for c in gc.get_referrers(*tuples):
                if isinstance(c, _CONTAINERS) and id(c) not in skip and c is not tuples:
                    for item in c.values() if isinstance(c, dict) else c:
                        if id(item) in by_tuple:
                            for v in by_tuple[id(item)]:
                                if id(v) in ids:
                                    out.setdefault(id(v), c)
        return out

    def local_tensors(self) -> dict[str, int]:
        """Bytes of the tensors the calling frames' variables hold, by name (to catch one grown by torch.cat)."""
        out: dict[str, int] = {}
        for f in self.frames[:8]:
            for name, value in list(f.f_locals.items()):
                if isinstance(value, torch.Tensor) and isinstance(name, str):
                    out.setdefault(f"`{name}` in {f.f_code.co_name}()", tensor_bytes([value]))
        return out


def _attributes(obj: Any) -> dict[str, Any]:
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - any object may turn up; one without a __dict__ has no attributes to name
        return {}
    return attrs if isinstance(attrs, dict) else {}

