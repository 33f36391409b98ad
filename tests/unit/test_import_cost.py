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


def test_every_public_name_is_reachable() -> None:
    namespace: dict[str, object] = {}
    exec("from ampkit import *", namespace)  # noqa: S102 - the star import is what this tests
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


def _run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``python -m ampkit ARGS`` with ``-X importtime``; return the result and the modules it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ampkit", *args], capture_output=True, text=True, timeout=120, check=False
    )
    # -X importtime writes "import time: self [us] | cumulative | module" to stderr, one line per import.
    imported = [line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    return result, imported


def test_help_lists_the_subcommands_without_importing_torch() -> None:
    result, imported = _run_cli("--help")
    assert result.returncode == 0, result.stderr
    for command in ("bench", "doctor", "env", "memory"):
        assert f"    {command} " in result.stdout
    assert imported, "no -X importtime lines: the check below would pass vacuously"
    assert _under(imported, ("torch", *TOOLS[:-1], *TOOL_DEPENDENCIES)) == []


@pytest.mark.parametrize("command", ["bench", "doctor", "env", "memory"])
def test_subcommand_help_imports_no_torch(command: str) -> None:
    result, imported = _run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: ampkit {command}")
    assert _under(imported, ("torch", *TOOLS[:-1], *TOOL_DEPENDENCIES)) == []
