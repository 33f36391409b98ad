"""Make ``import apex`` resolve to ``ampkit.apex`` for code that cannot change, without hiding a real Apex.

A finder at the front of ``sys.meta_path`` answers for ``apex`` and ``apex.*``. Where a real Apex is
installed, its modules win and the finder fills in only what it lacks (``apex.amp``, deleted in 2025), saying
so once; ``force=True`` puts ampkit's modules (:data:`PROVIDED`) in front of it, also said aloud, and the real
package itself and its other modules (``apex.contrib``, ``apex.transformer``, ...) still load from it. While ampkit provides the
``apex`` package itself, the finder also answers ``importlib.metadata`` for the distribution ``apex`` (tools such
as transformers ask for its version before they import it); a real Apex's own metadata always wins.

A real Apex whose ``__init__`` fails to import (``import amp_C`` raises: its CUDA extensions were never built) raises
an ImportError that names ``--force`` (``install(force=True)``), chained to its own; under ``force`` ampkit's package
stands in for it, said aloud.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import logging
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import __version__

__all__ = ["install", "uninstall", "Installed", "PROVIDED", "APEX_VERSION"]

log = logging.getLogger("ampkit")

# apex module name -> the ampkit module that stands in for it.
PROVIDED: dict[str, str] = {
    "apex": "ampkit.apex",
    "apex.amp": "ampkit.apex.amp",
    "apex.optimizers": "ampkit.apex.optimizers",
    "apex.parallel": "ampkit.apex.parallel",
    "apex.parallel.LARC": "ampkit.apex.parallel.LARC",
    "apex.parallel.distributed": "ampkit.apex.parallel.distributed",
    "apex.parallel.sync_batchnorm": "ampkit.apex.parallel.sync_batchnorm",
    "apex.fp16_utils": "ampkit.apex.fp16_utils",
    "apex.normalization": "ampkit.apex.normalization",
    "apex.multi_tensor_apply": "ampkit.apex.multi_tensor_apply",
}

# Apex's setup.py said 0.1 from its first release to its last, so checks written against Apex
# ("apex >= 0.1") hold; the local label names the provider and its version for bug reports.
APEX_VERSION = f"0.1+ampkit.{__version__}"


@dataclass(frozen=True)
class Installed:
    """What :func:`install` did: where a real Apex lives (None if none), and which modules ampkit supplies."""

    real_apex: str | None
    provided: tuple[str, ...]


class _AliasLoader(importlib.abc.Loader):
    """Loads an ``apex`` name as the already-importable ampkit module (one module object under two names)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the module; give the ampkit module its own back.
        module.__spec__ = self._spec


class _RealApexLoader(importlib.abc.Loader):
    """Runs a real Apex's ``__init__`` and, where it fails to import (its CUDA extensions were never built: ``import
    amp_C`` raises), names the way out; under ``force``, puts ampkit's package in its place instead."""

    def __init__(self, real: Any, location: str, force: bool) -> None:
        self.real = real
        self.location = location
        self.force = force

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # From here on the package is the real Apex's as if imported without ampkit (its resources, its source).
        module.__loader__ = self.real
        if module.__spec__ is not None:
            module.__spec__.loader = self.real
        try:
            self.real.exec_module(module)
        except ImportError as exc:
            failure = f"{type(exc).__name__}: {exc}"
            if not self.force:
                raise ImportError(
                    f"the real apex at {self.location} failed to import ({failure}); to run on ampkit's apex in its "
                    "place, use python -m ampkit.apex --force SCRIPT (in code: ampkit.apex.install(force=True)).",
                    name="apex",
                    path=self.location,
                ) from exc
            log.warning(
                "ampkit.apex: the real apex at %s failed to import (%s); under force, ampkit.apex stands in for the "
                "package itself too.", self.location, failure,
            )
            # The import system returns what sys.modules holds once exec_module is done: ampkit's package.
            sys.modules[module.__name__] = importlib.import_module("ampkit.apex")


def _real_package_spec(spec: importlib.machinery.ModuleSpec | None, force: bool) -> importlib.machinery.ModuleSpec | None:
    """``spec`` (a real ``apex`` package) loaded through :class:`_RealApexLoader`; a namespace package, which runs
    no code and so cannot fail, as it is."""
    if spec is None or spec.loader is None or not spec.has_location:
        return spec
    spec.loader = _RealApexLoader(spec.loader, spec.origin or "?", force)
    return spec


class _ApexFinder(importlib.abc.MetaPathFinder):
    def __init__(self, real_apex: str | None, force: bool, real_locations: Sequence[str] = ()) -> None:
        self.real_apex = real_apex
        self.force = force
        self.real_locations = list(real_locations)  # the real package's directories (its __path__)
        self.announced: set[str] = set()

    def _ours(self) -> bool:
        return self.real_apex is None or self.force

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "apex" and not fullname.startswith("apex."):
            return None
        if self.force and self.real_apex is not None:
            return self._forced_spec(fullname)
        if not self._ours():
            if fullname == "apex":
                return _real_package_spec(importlib.machinery.PathFinder.find_spec(fullname, path), force=False)
            if fullname not in PROVIDED:
                return None
            parent = sys.modules.get("apex")
            if parent is not None and importlib.machinery.PathFinder.find_spec(fullname, getattr(parent, "__path__", None)) is not None:
                return None  # the real Apex has this module: it wins
            if fullname not in self.announced:
                self.announced.add(fullname)
                log.warning("ampkit.apex: the real apex at %s has no %s; ampkit.apex supplies it.", self.real_apex, fullname)
        elif fullname not in PROVIDED:
            available = ", ".join(n for n in PROVIDED if n != "apex")
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: ampkit.apex provides {available}. For other Apex modules install a real "
                "Apex beside ampkit (ampkit then supplies only what it lacks).",
                name=fullname,
            )
        loader = _AliasLoader(PROVIDED[fullname])
        return importlib.machinery.ModuleSpec(fullname, loader, is_package=fullname in ("apex", "apex.parallel"))

    def _forced_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """Under ``force`` over a real Apex: ampkit's module for a :data:`PROVIDED` name, the real one for the rest.

        The package ``apex`` itself is the real one, so its ``__init__`` runs (and what its other modules import from
        it, such as ``apex.check_cudnn_version_and_warn``, exists); its ``from . import amp`` then gets ampkit's.
        """
        if fullname != "apex" and fullname in PROVIDED:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(PROVIDED[fullname]), is_package=fullname == "apex.parallel")
        if fullname == "apex":  # if its __init__ cannot run (CUDA extensions not built), ampkit's package instead
            found = importlib.machinery.PathFinder.find_spec(fullname, [str(Path(loc).parent) for loc in self.real_locations])
            return _real_package_spec(found, force=True)
        # A real module under one of ampkit's packages (apex.parallel.multiproc): the import system would look in
        # ampkit's directory, so look in the real package's own directory for that parent instead.
        parent = fullname.rsplit(".", 1)[0].split(".")[1:]
        return importlib.machinery.PathFinder.find_spec(fullname, [str(Path(loc, *parent)) for loc in self.real_locations])

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> Iterable[importlib.metadata.Distribution]:  # noqa: B008 - importlib's own signature; the context is only read
        """The ``apex`` distribution, while ampkit provides the package and no real Apex has metadata."""
        name = context.name
        if not self._ours() or name is not None and re.sub(r"[-_.]+", "_", name).lower() != "apex":
            return ()
        named = importlib.metadata.DistributionFinder.Context(name="apex", path=context.path)
        for finder in sys.meta_path:
            find = getattr(finder, "find_distributions", None)
            if not isinstance(finder, _ApexFinder) and find is not None and next(iter(find(named)), None) is not None:
                return ()  # a real Apex's metadata is on the path: it wins
        return (_ApexDistribution(),)


class _ApexDistribution(importlib.metadata.Distribution):
    """The metadata of the ``apex`` that ampkit provides: its name and :data:`APEX_VERSION`, no files."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: apex\nVersion: {APEX_VERSION}\nSummary: NVIDIA Apex's API, provided by ampkit.apex\n"
        return None

    def locate_file(self, path: Any) -> Path:
        return Path(__file__).parent / str(path)


def _finder() -> _ApexFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, _ApexFinder)), None)


def install(force: bool = False) -> Installed:
    """Make ``import apex`` (and ``apex.amp``, ``apex.optimizers``, ...) resolve to ampkit's modules.

    A real Apex found on ``sys.path`` is kept and only its missing modules are supplied, with a warning in
    the log; ``force=True`` puts ampkit's (:data:`PROVIDED`) in front of it, while the real package and its other
    modules (``apex.contrib``, ...) still load from it, or, where its ``__init__`` fails to import (CUDA extensions not
    built), ampkit's package stands in for it; without ``force`` that failure is an ImportError naming ``force``.
    Calling again replaces the previous install. While
    ampkit provides the package, ``importlib.metadata.version("apex")`` answers :data:`APEX_VERSION`.

    >>> installed = install()
    >>> import apex.amp
    >>> apex.amp.initialize.__module__
    'ampkit.apex._initialize'
    >>> import importlib.metadata; importlib.metadata.version("apex") == APEX_VERSION
    True
    >>> uninstall()
    """
    uninstall()
    spec = importlib.machinery.PathFinder.find_spec("apex")
    real = None
    if spec is not None:
        real = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
    finder = _ApexFinder(real, force, list(spec.submodule_search_locations or []) if spec is not None else [])
    sys.meta_path.insert(0, finder)
    if real is None or force:
        provided = tuple(PROVIDED)
        if real is not None:
            provided = tuple(n for n in PROVIDED if n != "apex")
            log.warning(
                "ampkit.apex.install(force=True): ampkit's %s shadow the real apex's; the package and its other modules "
                "(apex.contrib, ...) still load from %s.", ", ".join(provided), real,
            )
    else:
        has = [n for n in PROVIDED if n != "apex" and importlib.machinery.PathFinder.find_spec(n.split(".", 1)[1].split(".")[0], spec.submodule_search_locations) is not None]
        provided = tuple(n for n in PROVIDED if n != "apex" and n.split(".")[1] not in {h.split(".")[1] for h in has})
        log.warning(
            "ampkit.apex.install(): a real apex is installed at %s; its modules are kept and ampkit supplies only %s.",
            real,
            ", ".join(provided) or "nothing",
        )
    return Installed(real, provided)


def uninstall() -> None:
    """Undo :func:`install`: remove the finder and the ``apex`` names it created (ampkit's modules stay)."""
    finder = _finder()
    forced_over_real = False
    while finder is not None:
        forced_over_real |= finder.force and finder.real_apex is not None
        sys.meta_path.remove(finder)
        finder = _finder()
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        # A real Apex imported under force holds ampkit's modules as its attributes: forget it too, so the next
        # import loads it as it is.
        if forced_over_real or getattr(sys.modules[name], "__name__", "").startswith("ampkit."):
            del sys.modules[name]
