"""Old import paths of modules that moved into the layered layout, kept importable until :data:`REMOVED_IN`.

``import ampkit.engine`` gives the very module object ``ampkit.training.engine``, not a copy, so attributes set
on one (a test's monkeypatch, a user's logging tweak) are seen through the other, and pickles that name an old
path still load. The first import of an old path in a process warns (``FutureWarning``, shown by default) with the
path to write instead and the release that removes the old one; the warning points at the import statement's line.

    >>> import importlib, warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = sys.modules.pop("ampkit.engine", None)  # as the first import in a process
    ...     old = importlib.import_module("ampkit.engine")
    >>> old is importlib.import_module("ampkit.training.engine")
    True
    >>> print(caught[0].message)
    ampkit.engine moved to ampkit.training.engine; import ampkit.training.engine instead (the old path goes in ampkit 0.3.0).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "install"]

REMOVED_IN = "0.3.0"
"""The release that drops the old paths: the next minor release after the one that first warns about them."""

MOVED: dict[str, str] = {
    "ampkit.engine": "ampkit.training.engine",
    "ampkit.step_state": "ampkit.training.step_state",
    "ampkit.masters": "ampkit.policy.masters",
    "ampkit.training.masters": "ampkit.policy.masters",
    "ampkit.training.remainder_masters": "ampkit.policy.remainder_masters",
    "ampkit.training.remainder_bits": "ampkit.policy.remainder_bits",
    "ampkit.clipping": "ampkit.training.clipping",
    "ampkit.kernel_guards": "ampkit.training.kernel_guards",
    "ampkit.memory.micro_batching": "ampkit.training.micro_batching",
    "ampkit.checkpoint_payload": "ampkit.checkpoint.payload",
    "ampkit.checkpoint_checks": "ampkit.checkpoint.checks",
    "ampkit.distributed.checkpoint": "ampkit.checkpoint.sharded",
    "ampkit.distributed.checkpoint_dir": "ampkit.checkpoint.sharded_dir",
    "ampkit.distributed.dcp_state": "ampkit.checkpoint.dcp_state",
    "ampkit.distributed.safe_dcp": "ampkit.checkpoint.safe_dcp",
    "ampkit.distributed.sharded_load": "ampkit.checkpoint.sharded_load",
    "ampkit.rng": "ampkit.fileio.rng",
    "ampkit.state": "ampkit.fileio.checkpoint_files",
    "ampkit._util.atomic_files": "ampkit.fileio.atomic",
    "ampkit.blocks": "ampkit._util.blocks",
    # The workloads left the bench for a layer of their own, below every tool (bench, memory, doctor, profile).
    "ampkit.bench.workloads": "ampkit.workloads",
    "ampkit.bench.workloads.digits": "ampkit.workloads.digits",
    "ampkit.bench.workloads.digits_aug": "ampkit.workloads.digits_aug",
    "ampkit.bench.workloads.gpt": "ampkit.workloads.gpt",
    "ampkit.bench.workloads.resnet": "ampkit.workloads.resnet",
    "ampkit.bench.workloads.segment": "ampkit.workloads.segment",
    "ampkit.bench.workload": "ampkit.workloads.workload",
    "ampkit.bench.user": "ampkit.workloads.user",
    "ampkit.bench.metrics": "ampkit.workloads.metrics",
    "ampkit.bench.timing": "ampkit.workloads.timing",
}
"""Old dotted name -> the module's name now."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module swaps in the real module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = MOVED[old]
        # stacklevel 2 is the importer's frame: the warnings module skips the import machinery's own frames.
        warnings.warn(f"{old} moved to {new}; import {new} instead (the old path goes in ampkit {REMOVED_IN}).", FutureWarning, stacklevel=2)
        # The import system reads sys.modules back after exec_module, so the real module is what the importer
        # gets and what becomes the parent package's attribute; its own __spec__ is left untouched.
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Answer the old names (idempotent).

    First on the meta path, where it answers for the names of :data:`MOVED` alone (no file bears them): an old
    package's submodule (``ampkit.bench.workloads.gpt``) would otherwise be found by the path finder through the
    moved package's folder and loaded a second time, as another module with its own classes.
    """
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
