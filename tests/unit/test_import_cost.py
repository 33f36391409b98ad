"""What ``import ampkit`` and ``ampkit --help`` import: the core alone, no tool and none of the tools' dependencies.

Each check runs in a fresh interpreter: in the test process every module is already imported and would hide
an eager import. Times are not asserted (CI machines are noisy); the imported modules are.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ampkit

# The tools and the heavy dependencies only they need: none may load with the library core.
TOOLS = ("ampkit.bench", "ampkit.memory", "ampkit.numerics", "ampkit.cli")
TOOL_DEPENDENCIES = ("rich", "matplotlib", "sklearn", "tensorboard")


def _loaded_by(code: str) -> list[str]:
    """The modules in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def test_import_ampkit_loads_no_tool() -> None:
    loaded = _loaded_by("import ampkit")
    assert _under(loaded, TOOLS + TOOL_DEPENDENCIES) == []


def test_the_engine_loads_no_tool() -> None:
    # The engine reaches the tools (OOM splitting, the numerics sampler) only when a step asks for them.
    loaded = _loaded_by("from ampkit import Engine")
    assert "ampkit.engine" in loaded
    assert _under(loaded, TOOLS + TOOL_DEPENDENCIES) == []


def test_every_public_name_is_reachable() -> None:
    namespace: dict[str, object] = {}
    exec("from ampkit import *", namespace)
    assert set(ampkit.__all__) <= set(namespace)
    assert set(ampkit.__all__) <= set(dir(ampkit))
    for name in ampkit.__all__:
        assert getattr(ampkit, name) is namespace[name]
    # The hook itself, whatever this process imported before: each lazy name resolves to its module's object.
    for name, module in ampkit._LAZY.items():
        assert ampkit.__getattr__(name) is getattr(sys.modules[module], name)


def test_submodules_stay_attributes_and_unknown_names_fail() -> None:
    assert ampkit.__getattr__("memory") is sys.modules["ampkit.memory"]
    with pytest.raises(AttributeError, match="module 'ampkit' has no attribute 'no_such_name'"):
        ampkit.__getattr__("no_such_name")
