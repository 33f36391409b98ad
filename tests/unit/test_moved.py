"""Modules that moved into the layered layout answer to their old names, as the very same module objects."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest

from ampkit._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_imports_the_moved_module_itself(old):
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == MOVED[old]  # its own identity is kept: pickles and reprs name the new path
    parent, _, child = old.rpartition(".")
    assert getattr(importlib.import_module(parent), child) is module


def test_from_imports_and_patching_go_through_the_old_name(monkeypatch):
    from ampkit.engine import Engine
    from ampkit.training import engine

    assert Engine is engine.Engine
    import ampkit.engine

    monkeypatch.setattr(ampkit.engine, "log", "patched")
    assert engine.log == "patched"


def test_an_object_pickled_under_an_old_path_loads():
    # A pickle written before the move names ampkit.step_state.StepState; protocol 2 spells the path as text.
    from ampkit.training.step_state import StepState

    old = pickle.dumps(StepState(), protocol=2).replace(b"ampkit.training.step_state", b"ampkit.step_state")
    assert b"ampkit.step_state" in old
    assert isinstance(pickle.loads(old), StepState)


def test_old_names_work_in_a_fresh_interpreter():
    code = "import ampkit.state as s, ampkit.fileio.checkpoint_files as f; assert s is f; from ampkit.distributed.checkpoint import save_distributed"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_name_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ampkit.no_such_module")
