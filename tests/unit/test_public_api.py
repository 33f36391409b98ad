"""The public API, pinned: every name users import, its kind, and how it is called.

Each public module's ``__all__`` is rendered one line per name (and, for a class, one line per public method or
property) and compared with the snapshot committed beside this file. A line that changes, disappears or appears
is a change users see. If the change is deliberate, rewrite the snapshot and commit it with the change::

    AMPKIT_UPDATE_API=1 python -m pytest -q -p no:cacheprovider tests/unit/test_public_api.py

Where a name is defined is not pinned (moving ``Engine`` to another module keeps ``ampkit.Engine``), nor are
annotations: only parameter names, kinds and defaults, rendered the same on every supported torch and Python.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import importlib
import importlib.util
import inspect
import os
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

SNAPSHOT = Path(__file__).with_name("public_api.txt")
UPDATE_VARIABLE = "AMPKIT_UPDATE_API"

# The package faces: each package's __init__ (the modules behind it are internal, named _name.py), and the Apex
# shim's modules, whose import paths Apex code keeps (apex.parallel.LARC, ...). test_every_module_is_a_face_or_internal
# keeps this list and the source tree in step.
PUBLIC_MODULES = (
    "ampkit",
    "ampkit.accelerate",
    "ampkit.apex",
    "ampkit.apex.amp",
    "ampkit.apex.fp16_utils",
    "ampkit.apex.install",
    "ampkit.apex.multi_tensor_apply",
    "ampkit.apex.normalization",
    "ampkit.apex.optimizers",
    "ampkit.apex.parallel",
    "ampkit.apex.parallel.LARC",
    "ampkit.apex.parallel.distributed",
    "ampkit.apex.parallel.sync_batchnorm",
    "ampkit.bench",
    "ampkit.checkpoint",
    "ampkit.cli",
    "ampkit.distributed",
    "ampkit.fileio",
    "ampkit.lightning",
    "ampkit.memory",
    "ampkit.numerics",
    "ampkit.policy",
    "ampkit.profile",
    "ampkit.scaling",
    "ampkit.training",
    "ampkit.transformers",
    "ampkit.tuning",
    "ampkit.workloads",
)

# Dunder methods that are behaviour users rely on (calling, `with`, iterating); the rest are implementation.
_PROTOCOL_DUNDERS = ("__call__", "__enter__", "__exit__", "__iter__", "__len__", "__getitem__", "__contains__")


class _Shown:
    """A default value as the snapshot writes it (``repr`` of this object is the text)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _value(value: Any) -> str:
    """A default value, written the same on every torch and Python (no addresses, no module paths of torch)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if repr(value) == "<factory>":
        return "<factory>"  # a dataclass field's default_factory
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, torch.dtype):
        return str(value)  # "torch.float16"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_value(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({{{', '.join(sorted(_value(v) for v in value))}}})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_value(k)}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, type) or callable(value):
        return f"<{getattr(value, '__qualname__', type(value).__qualname__)}>"
    return f"<{type(value).__qualname__} object>"


def _signature(obj: Callable[..., Any]) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(signature unavailable)"
    parameters = [
        p.replace(annotation=inspect.Parameter.empty, default=p.default if p.default is inspect.Parameter.empty else _Shown(_value(p.default)))
        for p in signature.parameters.values()
    ]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "ampkit"


def _constructor(cls: type) -> str:
    # A constructor inherited from Python, typing or torch renders differently across their versions: not ours to pin.
    owner = next((k for k in cls.__mro__ if "__init__" in vars(k) or "__new__" in vars(k)), object)
    if owner is object:
        return "()"
    made = vars(owner).get("__init__", vars(owner).get("__new__"))
    source = (getattr(inspect.unwrap(getattr(made, "__func__", made)), "__module__", None) or owner.__module__).split(".")[0]
    if source != "ampkit":
        return f"(constructor from {source})"
    return _signature(cls)


def _public_bases(cls: type) -> list[str]:
    # Private bases are where code is shared, free to change; the public classes above them are what isinstance sees.
    names: list[str] = []
    for base in cls.__bases__:
        if base is object:
            continue
        for name in [base.__qualname__] if not base.__name__.startswith("_") else _public_bases(base):
            if name not in names:
                names.append(name)
    return names


def _members(qualified: str, cls: type) -> Iterator[str]:
    names = sorted({n for k in cls.__mro__ if _ours(k) for n in vars(k) if not n.startswith("_") or n in _PROTOCOL_DUNDERS})
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name in names:
        if name in fields:
            yield f"{qualified}.{name}: field"  # its default is in the constructor's signature
            continue
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if not _ours(owner):
            continue  # overrides nothing of ours: torch's own method, pinned by torch
        raw = vars(owner)[name]
        if isinstance(raw, property):
            yield f"{qualified}.{name}: property"
        elif isinstance(raw, classmethod):
            yield f"{qualified}.{name}: classmethod {_signature(getattr(cls, name))}"
        elif isinstance(raw, staticmethod):
            yield f"{qualified}.{name}: staticmethod {_signature(raw.__func__)}"
        elif inspect.isfunction(raw):
            yield f"{qualified}.{name}: method {_signature(raw)}"
        elif isinstance(raw, type):
            yield f"{qualified}.{name}: class"
        else:
            yield f"{qualified}.{name}: attribute"


def _render_class(qualified: str, cls: type) -> Iterator[str]:
    if not _ours(cls):
        yield f"{qualified}: class (from {cls.__module__.split('.')[0]})"
        return
    if issubclass(cls, enum.Enum):
        yield f"{qualified}: enum [{', '.join(cls.__members__)}]"
        return
    bases = ", ".join(_public_bases(cls))
    kind = "exception" if issubclass(cls, BaseException) else "class"
    yield f"{qualified}: {kind}({bases}) {_constructor(cls)}"
    yield from _members(qualified, cls)


def _render_constant(qualified: str, value: Any) -> str:
    kind = type(value).__qualname__
    if isinstance(value, types.UnionType) or typing.get_origin(value) is not None:
        return f"{qualified}: type alias"  # typing's reprs differ across Python versions
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return f"{qualified}: {kind} keys {sorted(value)}"
    if isinstance(value, (tuple, list, frozenset, set)) and all(isinstance(v, str) for v in value):
        return f"{qualified}: {kind} {sorted(value) if isinstance(value, (set, frozenset)) else list(value)}"
    return f"{qualified}: {kind}"


def render(module_name: str) -> Iterator[str]:
    """One line per public name of ``module_name`` (and per public member of each class it exports)."""
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__: declare its public names"
    yield f"{module_name}: module"
    for name in sorted(exported):
        qualified = f"{module_name}.{name}"
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            yield f"{qualified}: module"
        elif isinstance(value, type):
            yield from _render_class(qualified, value)
        elif callable(value) and not getattr(value, "__module__", "ampkit").startswith("ampkit"):
            yield f"{qualified}: function (from {value.__module__.split('.')[0]})"  # its signature is pinned upstream
        elif callable(value):
            yield f"{qualified}: function {_signature(value)}"
        else:
            yield _render_constant(qualified, value)


# The faces that import a training framework (an extra): where it is not installed (the oldest-torch leg installs the
# package alone), they are left out of the comparison, and their pinned lines with them.
FRAMEWORK_FACES: dict[str, tuple[str, ...]] = {
    "ampkit.accelerate": ("accelerate",),
    "ampkit.lightning": ("lightning",),
    "ampkit.transformers": ("transformers", "accelerate"),
}


def _absent_faces() -> list[str]:
    return [face for face, packages in FRAMEWORK_FACES.items() if any(importlib.util.find_spec(p) is None for p in packages)]


def current_api() -> str:
    absent = _absent_faces()
    return "".join(f"{line}\n" for module in PUBLIC_MODULES if module not in absent for line in render(module))


def _without(text: str, faces: list[str]) -> str:
    return "".join(line for line in text.splitlines(True) if not any(line.startswith((f"{face}:", f"{face}.")) for face in faces))


def test_public_api_matches_the_snapshot() -> None:
    current = current_api()
    absent = _absent_faces()
    if os.environ.get(UPDATE_VARIABLE) == "1":
        assert not absent, f"{UPDATE_VARIABLE}=1 needs every framework installed to pin their faces: missing for {absent}"
        SNAPSHOT.write_text(current)
        pytest.skip(f"{UPDATE_VARIABLE}=1: rewrote {SNAPSHOT.name}; review it with git diff and commit it")
    assert SNAPSHOT.exists(), f"{SNAPSHOT} is missing; write it with {UPDATE_VARIABLE}=1 (see this file's docstring)"
    expected = _without(SNAPSHOT.read_text(), absent)
    if current != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), current.splitlines(True), "public_api.txt (pinned)", "the code now"))
        pytest.fail(
            f"The public API changed ('-' pinned, '+' now):\n{diff}\nIf users may lose or must relearn a name, keep "
            f"the old one working. If the change is deliberate, rewrite the snapshot and commit it with the change:\n"
            f"    {UPDATE_VARIABLE}=1 python -m pytest -q -p no:cacheprovider tests/unit/test_public_api.py",
            pytrace=False,
        )


def _module_names(folder: Path, package: str) -> Iterator[str]:
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join([package, *parts])


def test_every_module_is_a_face_or_internal() -> None:
    # The surface is marked by name: a module users may import is a package face (its __init__) or an Apex path;
    # every other module is internal (_name.py) or sits in an internal package (_util, _report). A new module
    # that is neither would look public without being pinned here.
    folder = Path(importlib.import_module("ampkit").__file__).parent
    unmarked = [
        name
        for name in _module_names(folder, "ampkit")
        if not any(part.startswith("_") for part in name.split(".")) and name not in PUBLIC_MODULES
    ]
    assert unmarked == [], f"name these modules _name.py (internal), or list them in PUBLIC_MODULES (a face): {unmarked}"
    missing = [m for m in PUBLIC_MODULES if importlib.util.find_spec(m) is None]
    assert missing == []


def test_every_public_name_of_a_face_resolves() -> None:
    # A lazy face (__getattr__) lists names that load on first use: each must exist where the face says it is.
    absent = _absent_faces()
    for module_name in PUBLIC_MODULES:
        if module_name in absent:
            continue  # its framework is not installed here (the oldest-torch leg)
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert getattr(module, name, None) is not None or name in vars(module), f"{module_name}.{name}"


def test_the_rendering_drops_what_varies_across_torch_and_python() -> None:
    def f(a: torch.Tensor, /, b: int = 2, *args: Any, dtype: torch.dtype = torch.float16, device: Any = torch.device("cpu"), fn: Any = len, **kw: Any) -> None:
        pass

    assert _signature(f) == "(a, /, b=2, *args, dtype=torch.float16, device=torch.device('cpu'), fn=<len>, **kw)"
    assert _value(object()) == "<object object>"  # no address
