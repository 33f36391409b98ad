"""install(): `import apex` resolves to ampkit.apex, and a real Apex is never shadowed silently."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest

import ampkit.apex
from ampkit.apex import install, uninstall


@pytest.fixture(autouse=True)
def _forget_apex_modules():
    yield
    uninstall()
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_import_apex_resolves_to_ampkit():
    installed = install()
    assert installed.real_apex is None and "apex.amp" in installed.provided
    import apex
    from apex import amp

    assert apex is ampkit.apex and amp is ampkit.apex.amp
    import apex.amp as again

    assert again is ampkit.apex.amp
    # The ampkit module keeps its own identity.
    assert ampkit.apex.amp.__spec__.name == "ampkit.apex.amp"


def test_unknown_apex_module_names_what_is_provided():
    install()
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'apex.contrib': ampkit.apex provides apex.amp"):
        importlib.import_module("apex.contrib")


def test_uninstall_makes_apex_unimportable_again():
    install()
    importlib.import_module("apex.amp")
    uninstall()
    assert "apex" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("apex")


def _fake_apex(root, *modules: str) -> None:
    pkg = root / "apex"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    for name in modules:
        (pkg / f"{name}.py").write_text("REAL = True\n")


def test_real_apex_is_kept_and_only_amp_is_supplied(tmp_path, monkeypatch, caplog):
    _fake_apex(tmp_path, "optimizers")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        installed = install()
    assert installed.real_apex is not None and str(tmp_path) in installed.real_apex
    assert "apex.amp" in installed.provided and "apex.optimizers" not in installed.provided
    assert "a real apex is installed" in caplog.text
    import apex
    import apex.amp
    import apex.optimizers

    assert apex.REAL and apex.optimizers.REAL
    assert apex.amp is ampkit.apex.amp
    assert "has no apex.amp; ampkit.apex supplies it" in caplog.text


def test_real_apex_with_amp_wins_unless_forced(tmp_path, monkeypatch, caplog):
    _fake_apex(tmp_path, "amp")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = install()
    assert "apex.amp" not in installed.provided
    import apex.amp

    assert apex.amp.REAL
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        del sys.modules[name]
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        install(force=True)
    assert "shadow the real apex" in caplog.text
    import apex.amp as forced

    assert forced is ampkit.apex.amp
