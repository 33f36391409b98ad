"""Old import paths of modules that moved or became internal, kept importable until :data:`REMOVED_IN`.

Two kinds: modules that moved into the layered layout (:data:`MOVED`), and the internal modules that took a leading
underscore when the public surface was marked (:data:`UNDERSCORED`): a package's ``__init__`` is its face, the
modules behind it are ``_name.py``. ``import ampkit.engine`` gives the very module object ``ampkit.training._engine``, not a copy, so attributes set
on one (a test's monkeypatch, a user's logging tweak) are seen through the other, and pickles that name an old
path still load. The first import of an old path in a process warns (``FutureWarning``, shown by default) with the
path to write instead and the release that removes the old one; the warning points at the import statement's line.

    >>> import importlib, warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = sys.modules.pop("ampkit.engine", None)  # as the first import in a process
    ...     old = importlib.import_module("ampkit.engine")
    >>> old is importlib.import_module("ampkit.training._engine")
    True
    >>> print(caught[0].message)
    ampkit.engine is internal now (ampkit.training._engine); import its public names from ampkit.training instead (the old path goes in ampkit 0.3.0).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "OLD_PATHS", "REMOVED_IN", "UNDERSCORED", "advice", "clashes", "install", "public_home"]

REMOVED_IN = "0.3.0"
"""The release that drops the old paths: the next minor release after the one that first warns about them."""

MOVED: dict[str, str] = {
    "ampkit.engine": "ampkit.training._engine",
    "ampkit.step_state": "ampkit.training._step_state",
    "ampkit.masters": "ampkit.policy._masters",
    "ampkit.training.masters": "ampkit.policy._masters",
    "ampkit.training.remainder_masters": "ampkit.policy._remainder_masters",
    "ampkit.training.remainder_bits": "ampkit.policy._remainder_bits",
    "ampkit.clipping": "ampkit.training._clipping",
    "ampkit.kernel_guards": "ampkit.training._kernel_guards",
    "ampkit.memory.micro_batching": "ampkit.training._micro_batching",
    "ampkit.checkpoint_payload": "ampkit.checkpoint._payload",
    "ampkit.checkpoint_checks": "ampkit.checkpoint._checks",
    "ampkit.distributed.checkpoint": "ampkit.checkpoint._sharded",
    "ampkit.distributed.checkpoint_dir": "ampkit.checkpoint._sharded_dir",
    "ampkit.distributed.dcp_state": "ampkit.checkpoint._dcp_state",
    "ampkit.distributed.safe_dcp": "ampkit.checkpoint._safe_dcp",
    "ampkit.distributed.sharded_load": "ampkit.checkpoint._sharded_load",
    "ampkit.rng": "ampkit.fileio._rng",
    "ampkit.state": "ampkit.fileio._checkpoint_files",
    "ampkit._util.atomic_files": "ampkit.fileio._atomic",
    "ampkit.blocks": "ampkit._util.blocks",
    # The workloads left the bench for a layer of their own, below every tool (bench, memory, doctor, profile).
    "ampkit.bench.workloads": "ampkit.workloads",
    "ampkit.bench.workloads.digits": "ampkit.workloads._digits",
    "ampkit.bench.workloads.digits_aug": "ampkit.workloads._digits_aug",
    "ampkit.bench.workloads.gpt": "ampkit.workloads._gpt",
    "ampkit.bench.workloads.resnet": "ampkit.workloads._resnet",
    "ampkit.bench.workloads.segment": "ampkit.workloads._segment",
    "ampkit.bench.workload": "ampkit.workloads._workload",
    "ampkit.bench.user": "ampkit.workloads._user",
    "ampkit.bench.metrics": "ampkit.workloads._metrics",
    "ampkit.bench.timing": "ampkit.workloads._timing",
    # The report layer is private to the tools: nothing in it is for users.
    "ampkit.report": "ampkit._report",
    "ampkit.report.figures": "ampkit._report.figures",
    "ampkit.report.markdown": "ampkit._report.markdown",
    "ampkit.report.out_dir": "ampkit._report.out_dir",
    "ampkit.report.tables": "ampkit._report.tables",
}
"""Old dotted name -> the module's name now."""

UNDERSCORED: dict[str, str] = {
    "ampkit": "errors",
    "ampkit.bench": "api defaults flops format fp8_table memory model_io plots policy_run progress quality recipe report results runner speedup table tensorboard verdict",
    "ampkit.checkpoint": "checks dcp_state payload safe_dcp sharded sharded_dir sharded_load",
    "ampkit.cli": "bench checks console doctor env main memory parsers profile workload_args",
    "ampkit.distributed": "agreement ddp environment fsdp launch rank_logging strategy",
    "ampkit.fileio": "atomic checkpoint_files rng",
    "ampkit.memory": "accounting batch_finder cuda_attention estimate fake fit fp8_layers leak_graphs leak_holders leak_names leak_scan oom process recompute recompute_measure recompute_report recompute_select recompute_wrap tracker tracker_growth tracker_results tracker_watch workspaces",
    "ampkit.numerics": "cells compare compiled doctor engine_code formats fp8_headroom fp8_table plots recommend recorder report sample sampler scale severity stats table tensor_stats update_audit update_remedy",
    "ampkit.policy": "base device fp8 fp8_matmuls fp8_roofline full gpu_specs half islands lowbit lowbit_optimizers masters mixed registry remainder_bits remainder_masters",
    "ampkit.profile": "advice files idle op_count op_shares phases plots report run session syncs table trials",
    "ampkit.scaling": "base config diagnosis dynamic kernels protocol static",
    "ampkit.training": "clipping collapse compile engine engine_args engine_setup engine_state engine_view fused_library_step fused_master_step fused_step_compile fused_step_region hooks kernel_guards micro_batching misuse model_setup oom optimizer_step read_only regions rounding_stream step_state",
    "ampkit.workloads": "choose defaults device digits digits_aug gpt metrics precisions recipe registry resnet segment timing user workload",
}
"""Package -> its internal modules that were public-looking before 0.2.0 (``ampkit.training.engine`` is now
``ampkit.training._engine``). Each old name answers as :data:`MOVED`'s do."""

def clashes(old: str) -> bool:
    """Whether an old module path is also a public name of its package (``ampkit.memory.recompute``, the function;
    ``ampkit.cli.main``, the entry point). Aliasing such a module would make the import system overwrite that name on
    the package with the module, so its import is refused instead, naming the public name to import.

    >>> import ampkit.memory
    >>> clashes("ampkit.memory.recompute"), clashes("ampkit.memory.tracker")
    (True, False)
    """
    parent, _, leaf = old.rpartition(".")
    package = sys.modules.get(parent)  # the import system imports the parent before it asks for the child
    return package is not None and leaf in getattr(package, "__all__", ())


def _renamed() -> dict[str, str]:
    renamed = {f"{package}.{name}": f"{package}._{name}" for package, names in UNDERSCORED.items() for name in names.split()}
    return {**renamed, **MOVED}


OLD_PATHS: dict[str, str] = _renamed()
"""Every old dotted name -> the module's name now: :data:`MOVED` and :data:`UNDERSCORED` together."""


def public_home(module: str) -> str:
    """Where a module's public names are imported from: the module itself, or the public package above it.

    >>> public_home("ampkit.workloads"), public_home("ampkit.training._engine"), public_home("ampkit._report.tables")
    ('ampkit.workloads', 'ampkit.training', 'ampkit')
    """
    return module.split("._")[0]


def advice(old: str) -> str:
    """The warning an old path gives: the module's name now, where to import from, and when the old path goes.

    >>> print(advice("ampkit.bench.workloads"))
    ampkit.bench.workloads moved to ampkit.workloads; import ampkit.workloads instead (the old path goes in ampkit 0.3.0).
    """
    new = OLD_PATHS[old]
    home = public_home(new)
    if home == new:
        return f"{old} moved to {new}; import {new} instead (the old path goes in ampkit {REMOVED_IN})."
    return f"{old} is internal now ({new}); import its public names from {home} instead (the old path goes in ampkit {REMOVED_IN})."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in OLD_PATHS and clashes(fullname):
            name = fullname.rpartition(".")[2]
            raise ModuleNotFoundError(
                f"{fullname} is internal now ({OLD_PATHS[fullname]}); import {name} from {public_home(OLD_PATHS[fullname])} instead.", name=fullname
            )
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in OLD_PATHS else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module swaps in the real module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = OLD_PATHS[old]
        # stacklevel 2 is the importer's frame: the warnings module skips the import machinery's own frames.
        warnings.warn(advice(old), FutureWarning, stacklevel=2)
        # The import system reads sys.modules back after exec_module, so the real module is what the importer
        # gets and what becomes the parent package's attribute; its own __spec__ is left untouched.
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Answer the old names (idempotent).

    First on the meta path, where it answers for the names of :data:`OLD_PATHS` alone (no file bears them): an old
    package's submodule (``ampkit.bench.workloads.gpt``) would otherwise be found by the path finder through the
    moved package's folder and loaded a second time, as another module with its own classes.
    """
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
