"""install(): `import apex` resolves to ampkit.apex, and a real Apex is never shadowed silently."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys

import pytest

import ampkit.apex
from ampkit.apex import install, uninstall

pytestmark = pytest.mark.usefixtures("forget_apex_modules")


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


# ------------------------------------------------------------------------------ distribution metadata
def _apex_without_extensions(root) -> None:
    """A real Apex whose CUDA extensions were never built: its ``__init__`` fails to import."""
    (root / "apex").mkdir()
    (root / "apex" / "__init__.py").write_text("import amp_C  # built by Apex's setup.py --cuda_ext, absent here\n")


def test_a_real_apex_that_fails_to_import_names_force(tmp_path, monkeypatch):
    _apex_without_extensions(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    install()
    with pytest.raises(ImportError, match=r"real apex at .* failed to import \(ModuleNotFoundError: No module named 'amp_C'\); .*--force") as info:
        importlib.import_module("apex")
    assert "install(force=True)" in str(info.value)
    assert isinstance(info.value.__cause__, ModuleNotFoundError) and info.value.__cause__.name == "amp_C"  # kept, chained
    assert "apex" not in sys.modules


def test_force_stands_in_for_a_real_apex_that_fails_to_import(tmp_path, monkeypatch, caplog):
    _apex_without_extensions(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    install(force=True)
    with caplog.at_level(logging.WARNING, logger="ampkit"):
        import apex
        from apex import amp
    assert apex is ampkit.apex and amp is ampkit.apex.amp
    assert any("No module named 'amp_C'" in r.getMessage() and "stands in for the package itself" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("force", [False, True])
def test_a_real_apex_that_imports_is_loaded_as_without_ampkit(tmp_path, monkeypatch, caplog, force):
    _fake_apex(tmp_path, "optimizers")
    monkeypatch.syspath_prepend(str(tmp_path))
    install(force=force)
    import apex

    assert apex.REAL and apex.__file__ == str(tmp_path / "apex" / "__init__.py")
    # Its own loader, not ampkit's wrapper: importlib.resources, inspect and pkgutil see the package as it is.
    assert type(apex.__loader__) is importlib.machinery.SourceFileLoader and apex.__spec__.loader is apex.__loader__
    assert not any("failed to import" in r.getMessage() for r in caplog.records)


def test_apex_version_answers_while_installed_and_not_after():
    from packaging.version import Version

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")
    install()
    version = importlib.metadata.version("apex")
    # Apex's own setup.py said 0.1 to the end; the local label says who provides it.
    assert version == f"0.1+ampkit.{ampkit.__version__}" and Version(version).public == "0.1"
    assert importlib.metadata.metadata("apex")["Name"] == "apex"
    assert importlib.metadata.version("Apex") == version  # names compare normalised, as pip's do
    assert "apex" in {d.metadata["Name"] for d in importlib.metadata.distributions()}
    uninstall()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")


def _fake_dist_info(root, version: str) -> None:
    info = root / f"apex-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: apex\nVersion: {version}\n")


@pytest.mark.parametrize("force", [False, True])
def test_a_real_apex_keeps_its_own_version(tmp_path, monkeypatch, force):
    _fake_apex(tmp_path, "optimizers")
    _fake_dist_info(tmp_path, "25.9")
    monkeypatch.syspath_prepend(str(tmp_path))
    install(force=force)
    assert importlib.metadata.version("apex") == "25.9"
    assert [d.version for d in importlib.metadata.distributions(name="apex")] == ["25.9"]


def test_a_real_apex_without_metadata_is_not_given_ampkits(tmp_path, monkeypatch):
    # ampkit answers only for an apex it provides itself; a vendored copy it merely fills in is not its to describe.
    _fake_apex(tmp_path, "optimizers")
    monkeypatch.syspath_prepend(str(tmp_path))
    install()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")
    install(force=True)
    assert importlib.metadata.version("apex").startswith("0.1+ampkit")


def test_transformers_sees_apex_while_installed():
    import_utils = pytest.importorskip("transformers.utils.import_utils", reason="Requires: transformers (pip install -e '.[hf]')")

    def available() -> tuple[bool, bool]:
        import_utils.is_apex_available.cache_clear()  # it caches its first answer for the process
        # transformers 4.27-4.4x also asked importlib.metadata and reported "APEX is not installed" without it.
        older = importlib.util.find_spec("apex") is not None and bool(importlib.metadata.version("apex"))
        return import_utils.is_apex_available(), older

    install()
    assert available() == (True, True)
    uninstall()
    import_utils.is_apex_available.cache_clear()
    assert import_utils.is_apex_available() is False


# ------------------------------------------------------------------------------ force keeps the real Apex's other modules
# A real Apex as installed today: its own amp (an old one), contrib whose modules reach the package's top level (as
# apex.contrib's do: `from apex import check_cudnn_version_and_warn`), and a parallel package with a module ampkit lacks.
_REAL_APEX = {
    "__init__.py": "REAL = True\ndef check_cudnn_version_and_warn(option, version):\n    return True\n",
    "amp.py": "REAL = True\n",
    "contrib/__init__.py": "REAL = True\nfrom apex import check_cudnn_version_and_warn\n",
    "contrib/sparsity.py": "REAL = True\nfrom apex.contrib import REAL as PARENT_REAL\n",
    "parallel/__init__.py": "REAL = True\n",
    "parallel/multiproc.py": "REAL = True\n",
}

_FORCED = """
import sys
import ampkit.apex
from ampkit.apex import install
install(force=True)
import apex
import apex.contrib.sparsity
import apex.parallel.multiproc
from apex import amp
from apex.parallel import DistributedDataParallel
print("amp", amp is ampkit.apex.amp, apex.amp is ampkit.apex.amp)
print("parallel", DistributedDataParallel.__module__.startswith("ampkit."))
print("contrib", apex.contrib.REAL, apex.contrib.sparsity.PARENT_REAL)
print("multiproc", apex.parallel.multiproc.REAL)
print("top", apex.check_cudnn_version_and_warn("x", 1))
"""


def write_real_apex(root) -> None:
    for name, text in _REAL_APEX.items():
        (root / "apex" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "apex" / name).write_text(text)


def test_force_puts_ampkits_modules_in_front_and_keeps_the_real_apexs_others(tmp_path):
    import os
    import subprocess

    write_real_apex(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _FORCED], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == ["amp True True", "parallel True", "contrib True True", "multiproc True", "top True"]
    assert "still load from" in out.stderr  # the warning names what is shadowed and where the rest comes from
