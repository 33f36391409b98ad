"""Modules that moved, or became internal (underscored), answer to their old names as the very same module objects, and warn."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ampkit._moved import OLD_PATHS, REMOVED_IN, UNDERSCORED, advice, clashes


@contextmanager
def _old_paths() -> Iterator[None]:
    """Old paths imported on purpose: their FutureWarning is what the warning tests check, not these."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _clashing() -> list[str]:
    # clashes() reads the parent package's public names, so each parent that is a package of today is imported first.
    parents = {old.rpartition(".")[0] for old in OLD_PATHS} - set(OLD_PATHS)
    for parent in parents:
        importlib.import_module(parent)
    return sorted(old for old in OLD_PATHS if clashes(old))


CLASHING = _clashing()
ALIASED = sorted(set(OLD_PATHS) - set(CLASHING))


@pytest.mark.parametrize("old", ALIASED)
def test_an_old_name_imports_the_moved_module_itself(old):
    with _old_paths():
        module = importlib.import_module(old)
    assert module is importlib.import_module(OLD_PATHS[old])
    assert module.__name__ == OLD_PATHS[old]  # its own identity is kept: pickles and reprs name the new path
    parent, _, child = old.rpartition(".")
    assert getattr(importlib.import_module(parent), child) is module


def test_from_imports_and_patching_go_through_the_old_name(monkeypatch):
    with _old_paths():
        import ampkit.engine
        from ampkit.engine import Engine
    from ampkit.training import _engine as engine

    assert Engine is engine.Engine

    monkeypatch.setattr(ampkit.engine, "log", "patched")
    assert engine.log == "patched"


def test_an_object_pickled_under_an_old_path_loads():
    # A pickle written before the move names ampkit.step_state.StepState; protocol 2 spells the path as text.
    from ampkit.training._step_state import StepState

    old = pickle.dumps(StepState(), protocol=2).replace(b"ampkit.training._step_state", b"ampkit.step_state")
    assert b"ampkit.step_state" in old
    with _old_paths():
        assert isinstance(pickle.loads(old), StepState)


def test_old_names_work_in_a_fresh_interpreter():
    code = "import ampkit.state as s, ampkit.fileio._checkpoint_files as f; assert s is f; from ampkit.distributed.checkpoint import save_distributed"
    subprocess.run([sys.executable, "-W", "ignore::FutureWarning", "-c", code], check=True)


def test_an_unknown_name_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ampkit.no_such_module")


@pytest.mark.parametrize("old", ALIASED)
def test_an_old_name_warns_naming_the_new_path_and_the_release_that_removes_it(old):
    sys.modules.pop(old, None)  # as its first import: a test before this one may have imported it already
    with pytest.warns(FutureWarning) as caught:
        __import__(old)  # as an import statement imports it: from this line, not from importlib's
    assert sys.modules[old] is importlib.import_module(OLD_PATHS[old])
    (warning,) = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert str(warning.message) == advice(old)
    assert OLD_PATHS[old] in str(warning.message) and f"ampkit {REMOVED_IN}" in str(warning.message)
    assert warning.filename == __file__  # the line that imports the old path, not the import machinery's


def test_an_old_name_warns_in_a_fresh_interpreter_at_the_importing_line():
    code = "import warnings; warnings.simplefilter('error', FutureWarning)\nimport ampkit.bench.user"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "FutureWarning: ampkit.bench.user is internal now (ampkit.workloads._user)" in done.stderr


def test_a_moved_package_answers_for_its_old_submodules_with_the_moved_modules_themselves():
    # ampkit.bench.workloads is ampkit.workloads now: its old submodule path must not load a second copy of gpt.py
    # through the new folder (two GPT classes, two registries).
    with _old_paths():
        old_package = importlib.import_module("ampkit.bench.workloads")
        old_module = importlib.import_module("ampkit.bench.workloads.gpt")
    assert old_package is importlib.import_module("ampkit.workloads")
    assert old_module is importlib.import_module("ampkit.workloads._gpt")


def test_an_internal_module_warns_naming_the_public_package_to_import_from_instead():
    assert advice("ampkit.training.engine") == (
        "ampkit.training.engine is internal now (ampkit.training._engine); import its public names from ampkit.training"
        f" instead (the old path goes in ampkit {REMOVED_IN})."
    )
    assert advice("ampkit.bench.workloads").startswith("ampkit.bench.workloads moved to ampkit.workloads; import ampkit.workloads instead")


def test_every_underscored_module_exists_and_its_old_name_has_no_file():
    for package, names in UNDERSCORED.items():
        for name in names.split():
            assert importlib.util.find_spec(f"{package}._{name}") is not None, f"{package}._{name}"
            folder = importlib.import_module(package).__path__[0]
            assert not (Path(folder) / f"{name}.py").exists(), f"{package}.{name} has a file again: drop it from UNDERSCORED"


def test_the_clashing_old_paths_are_the_known_ones():
    assert CLASHING == ["ampkit.cli.main", "ampkit.memory.estimate", "ampkit.memory.recompute"]


@pytest.mark.parametrize("old", CLASHING)
def test_an_old_module_path_that_is_also_a_public_function_is_refused_naming_the_function_to_import(old, monkeypatch):
    package, _, name = old.rpartition(".")
    function = getattr(importlib.import_module(package), name)
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.raises(ModuleNotFoundError, match=rf"import {name} from {package} instead"):
        importlib.import_module(old)
    assert getattr(importlib.import_module(package), name) is function  # the function is still what the package gives
